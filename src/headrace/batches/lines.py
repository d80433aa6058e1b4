"""A batch input file's lines: one JSON request each, `{custom_id, method: "POST", url, body}`.

Checked whole at upload, so that a bad file is refused with the line that is wrong (400) rather
than accepted and failed later; the body itself is the route's to validate when the line runs
(a bad body fails that line alone, into the error file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


class InputError(ValueError):
    """An input file that cannot be a batch; the message names the line (1-based)."""


@dataclass(frozen=True)
class InputLine:
    index: int  # 0-based position in the file: the line's key in the batch
    custom_id: str
    url: str
    body: dict[str, Any]


def parse_input(data: bytes, max_lines: int, max_line_bytes: int | None = None) -> list[InputLine]:
    """Every line of a batch input file (blank lines skipped); InputError for the first bad one.
    `max_line_bytes`: the server's body limit (a line is one request's body, and more)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"the file is not UTF-8 (byte {e.start})") from e
    lines: list[InputLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if max_line_bytes is not None and len(raw.encode()) > max_line_bytes:
            raise InputError(f"line {number}: longer than the limit of {max_line_bytes} bytes")
        if len(lines) == max_lines:
            raise InputError(f"line {number}: the file has more than {max_lines} requests")
        line = _parse_line(raw, number, len(lines))
        if line.custom_id in seen:
            raise InputError(f"line {number}: custom_id {line.custom_id!r} is used twice")
        seen.add(line.custom_id)
        lines.append(line)
    if not lines:
        raise InputError("the file holds no requests")
    return lines


def _parse_line(raw: str, number: int, index: int) -> InputLine:
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InputError(f"line {number}: not valid JSON: {e.msg}") from e
    if not isinstance(item, dict):
        raise InputError(f"line {number}: not a JSON object")
    custom_id, method, url, body = (item.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        raise InputError(f"line {number}: custom_id must be a non-empty string")
    if method != "POST":
        raise InputError(f'line {number}: method must be "POST"')
    if url not in ENDPOINTS:
        raise InputError(f"line {number}: url must be one of {', '.join(ENDPOINTS)}")
    if not isinstance(body, dict):
        raise InputError(f"line {number}: body must be a JSON object")
    if body.get("stream"):
        raise InputError(f"line {number}: a batch request cannot stream")
    return InputLine(index, custom_id, str(url), body)
