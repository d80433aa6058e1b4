"""Headrace api."""
