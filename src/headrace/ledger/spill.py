"""Where the ledger's records go when the database cannot take them and the memory bound is
reached: a local JSON-lines file, written back (oldest first) by the first flush that writes
again, then emptied. A graceful stop during an outage spills what is still held, and the next
start writes it. Only when this file cannot be written either (a full disk) are records lost,
and counted.

One file per ledger target; its lock (cache_files.locked) keeps two front ends that share a
state directory from reading it while the other appends."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headrace.cache_files import locked
from headrace.ledger.records import AuditEntry, UsageRecord

log = logging.getLogger("headrace.ledger")
Item = UsageRecord | AuditEntry
_KINDS: dict[str, type[UsageRecord] | type[AuditEntry]] = {
    "usage": UsageRecord, "audit": AuditEntry,
}  # fmt: skip


class Spill:
    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, items: Sequence[Item]) -> bool:
        """Append `items`; False when the file cannot be written (the caller drops them)."""
        lines = "".join(_line(item) + "\n" for item in items)
        try:
            with locked(self.path), self.path.open("a", encoding="utf-8") as f:
                f.write(lines)
            return True
        except OSError as e:
            log.error("cannot spill %d ledger records to %s: %s", len(items), self.path, e)
            return False

    def waiting(self) -> bool:
        try:
            return self.path.stat().st_size > 0
        except OSError:
            return False

    def drain(self, write: Any) -> int:
        """`write(items)` with every spilled record, oldest first, then empty the file (only
        if `write` returned: a write that raises leaves the file for the next flush).
        Returns how many records were written."""
        with locked(self.path):
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return 0
            items = [item for line in text.splitlines() if (item := _item(line)) is not None]
            write(items)
            self.path.unlink()
        return len(items)


def _line(item: Item) -> str:
    kind = "usage" if isinstance(item, UsageRecord) else "audit"
    return json.dumps({"kind": kind, **dataclasses.asdict(item)}, default=str)


def _item(line: str) -> Item | None:
    """The record of one line; None for a line a crash cut short (logged, skipped)."""
    if not line.strip():
        return None
    try:
        fields = json.loads(line)
        return _KINDS[fields.pop("kind")](**fields)
    except (ValueError, KeyError, TypeError) as e:
        log.error("a spilled ledger record cannot be read back, skipped: %s", e)
        return None
