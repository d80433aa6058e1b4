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
        """Append `items`; False when they cannot be written (the caller drops them)."""
        try:
            lines = "".join(_line(item) + "\n" for item in items)
            with locked(self.path), self.path.open("a+b") as f:
                if f.tell() > 0:  # a line a crash cut short must not swallow the next one
                    f.seek(-1, 2)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
                f.write(lines.encode("utf-8"))
            return True
        except Exception as e:  # noqa: BLE001  (a full disk, or a record that will not encode)
            log.error("cannot spill %d ledger records to %s: %s", len(items), self.path, e)
            return False

    def waiting(self) -> bool:
        try:
            return self.path.stat().st_size > 0
        except OSError:
            return False

    def drain(self, write: Any) -> int:
        """`write(items)` with every spilled record, oldest first, then empty the file (only
        if `write` returned: a write that raises leaves the file for the next flush). A file
        that cannot be read is put aside (`.unreadable`), logged, and the ledger goes on.
        Returns how many records were written. A crash between the write and the emptying
        writes them again at the next start."""
        with locked(self.path):
            try:
                text = self.path.read_bytes().decode("utf-8", errors="replace")
            except FileNotFoundError:
                return 0
            except OSError as e:
                self._put_aside(e)
                return 0
            items = [item for line in text.splitlines() if (item := _item(line)) is not None]
            write(items)
            self._empty()
        return len(items)

    def _empty(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            try:
                self.path.write_bytes(b"")  # at least never write them twice
            except OSError:
                log.exception("the spill file %s cannot be emptied: its records may be "
                              "written again", self.path)  # fmt: skip

    def _put_aside(self, e: Exception) -> None:
        aside = self.path.with_name(self.path.name + ".unreadable")
        log.error("cannot read the ledger's spill file %s (%s): moved to %s", self.path, e, aside)
        try:
            self.path.replace(aside)
        except OSError:
            log.exception("and it cannot be moved aside either")


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
    except Exception as e:  # noqa: BLE001  (any malformed line: skipped, never fatal)
        log.error("a spilled ledger record cannot be read back, skipped: %s", e)
        return None
