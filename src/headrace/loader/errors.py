"""The one error the loader raises: it names the file or tensor and what was expected."""

from __future__ import annotations


class ModelLoadError(Exception):
    pass
