"""Headrace loader."""
