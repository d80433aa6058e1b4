"""Headrace layers."""
