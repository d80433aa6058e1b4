"""Where Headrace keeps what it makes once and reuses (converted models, built kernels: the
cache) and what it must not lose (the usage ledger: the state directory)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if env := os.environ.get("HEADRACE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headrace"


def state_root() -> Path:
    """$HEADRACE_STATE, else $XDG_STATE_HOME/headrace, else ~/.local/state/headrace."""
    if env := os.environ.get("HEADRACE_STATE"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "headrace"
