"""Headrace metrics."""
