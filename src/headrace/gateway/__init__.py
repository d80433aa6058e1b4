"""Headrace gateway."""
