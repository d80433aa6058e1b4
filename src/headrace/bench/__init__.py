"""Headrace bench."""
