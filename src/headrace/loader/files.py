"""Reading a model directory's JSON files (no torch: the front end reads them too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headrace.loader.errors import ModelLoadError


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing {what}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read {what}: {e}") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: {what} is not a JSON object")
    return data
