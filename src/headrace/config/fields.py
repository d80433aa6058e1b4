"""The pieces every settings class is made of: a field with its flag's help text."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, help: str) -> Any:
    """A field whose `help` becomes its CLI flag's (`config/args.py`)."""
    return field(default=default, metadata={"help": help})


def items(text: str | None) -> list[str]:
    """A comma-separated flag's items, stripped, the empty ones left out."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]
