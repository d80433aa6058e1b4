"""Headrace router."""
