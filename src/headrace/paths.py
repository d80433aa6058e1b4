"""Where Headrace keeps what it makes once and reuses: converted models, built kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if env := os.environ.get("HEADRACE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headrace"
