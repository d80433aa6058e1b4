"""`Ledger`: records appended from the event loop without waiting, written by a thread of its
own in batches every `flush_s`.

The database can fail (a full disk, a locked or unwritable file, a lost PostgreSQL
connection): the request that made a record never hears of it. Unwritten records are held in
memory and tried again at each flush; past `max_pending` the oldest go to the spill file
(spill.py; `spilled`), written back by the first flush that writes again; only where that file
cannot be written either are they dropped, and counted (`dropped`). `close()` writes
everything still queued, or spills it: a graceful stop loses nothing; a SIGKILL loses what
arrived since the last flush (at most `flush_s` of records).
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from typing import Any

from headrace.ledger import store
from headrace.ledger.database import Database, describe, is_postgres
from headrace.ledger.query import UsageQuery
from headrace.ledger.records import AuditEntry, UsageRecord
from headrace.ledger.spill import Spill

log = logging.getLogger("headrace.ledger")
Item = UsageRecord | AuditEntry


class Ledger:
    def __init__(
        self,
        path: str | Path,
        flush_s: float = 1.0,
        max_pending: int = 100_000,
        spill: Path | None = None,
    ) -> None:
        """`spill`: the overflow file (default: beside an SQLite file; none for a URL)."""
        self.target = str(path)  # a file, or a postgresql:// URL
        self.name = describe(self.target)  # for log lines: no password
        self.flush_s = flush_s
        self.max_pending = max_pending
        if spill is None and not is_postgres(self.target):
            spill = Path(self.target + ".spill.jsonl")
        self._spill = Spill(spill) if spill is not None else None
        self.written = 0
        self.spilled = 0
        self.dropped = 0
        self.write_errors = 0
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=max_pending)
        self._held: list[Item] = []  # drained from the queue, not written yet
        self._conn: Database | None = None
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._drops = threading.Lock()
        self._requested = 0  # flushes asked for by `sync`, and done
        self._done = 0
        self._closing = False
        self._closed = False
        self._failing = False
        try:  # now: its descriptors are there before the first request (a server's are counted),
            self._conn = store.connect(self.target)
        except Exception:  # noqa: BLE001  (a ledger not writable yet: the first flush says so)
            self._conn = None
        self._thread = threading.Thread(target=self._run, name="headrace-ledger", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._queue.qsize() + len(self._held)

    def append(self, item: Item) -> None:
        """Queue `item` for the next flush; never blocks, never raises (a full queue, or a
        closed ledger, counts it as dropped)."""
        if self._closed:
            self._drop(1)
            log.warning("ledger closed: a record arrived too late and is dropped")
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(1)

    def _drop(self, n: int) -> None:
        with self._drops:  # the event loop's thread and the writer's both drop
            self.dropped += n

    def sync(self, timeout: float = 5.0) -> bool:
        """Flush now and wait for it (what was appended before is written, or held on an
        error); False if that took longer than `timeout`."""
        with self._cond:
            self._requested += 1
            want = self._requested
            self._wake.set()
            return self._cond.wait_for(lambda: self._done >= want or self._closed, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued and stop the thread."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        self._closed = True
        if self.pending and not self._thread.is_alive():
            self._overflow(len(self._held) + self._queue.qsize())
        if self.pending:
            log.error("ledger closed with %d records unwritten: %s", self.pending, self.name)

    def read(self, work: Any, *args: Any) -> Any:
        """`work(conn, *args)` on a connection of its own (call it off the event loop)."""
        self.sync()
        conn = store.connect(self.target)
        try:
            return work(conn, *args)
        finally:
            conn.close()

    def totals(self, query: UsageQuery) -> list[dict[str, Any]]:
        return list(self.read(store.totals, query))

    def audit(self, start: float | None, end: float | None, limit: int) -> list[dict[str, Any]]:
        return list(self.read(store.audit_rows, start, end, limit))

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            closing = self._closing
            with self._cond:
                serving = self._requested
            self._flush()
            with self._cond:
                self._done = serving
                self._cond.notify_all()
            if closing:
                break
        if self._conn is not None:
            self._conn.close()

    def _flush(self) -> None:
        while True:
            try:
                self._held.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not self._held and not (self._spill and self._spill.waiting()):
            return
        try:
            self._write()
        except Exception as e:
            self._failed(e)

    def _write(self) -> None:
        if self._conn is None:
            self._conn = store.connect(self.target)
        if self._spill is not None and self._spill.waiting():  # older: first
            self.written += self._spill.drain(self._append)
        self._append(self._held)
        if self._failing:
            log.warning("ledger writable again: %s", self.name)
            self._failing = False
        self.written += len(self._held)
        self._held.clear()

    def _append(self, items: list[Item]) -> None:
        assert self._conn is not None
        usage = [r for r in items if isinstance(r, UsageRecord)]
        audit = [r for r in items if isinstance(r, AuditEntry)]
        store.append(self._conn, usage, audit)

    def _failed(self, e: Exception) -> None:
        if not self._failing:  # the first failure of a streak is logged
            log.error("cannot write the ledger %s (records held, retried): %s", self.name, e)
            self._failing = True
        self.write_errors += 1
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._overflow(len(self._held) - self.max_pending)

    def _overflow(self, n: int) -> None:
        """The oldest `n` held (then queued) records go to the spill file, or are dropped."""
        while len(self._held) < n:
            try:
                self._held.append(self._queue.get_nowait())
            except queue.Empty:
                break
        out = self._held[: max(n, 0)]
        if not out:
            return
        spilled = self._spill is not None and self._spill.add(out)
        del self._held[: len(out)]  # only now: spilled, or dropped and counted
        if spilled:
            self.spilled += len(out)
        else:
            self._drop(len(out))
