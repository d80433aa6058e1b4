"""Headrace models."""
