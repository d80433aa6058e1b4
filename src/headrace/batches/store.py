"""Files and batch jobs on disk: one SQLite database (WAL) for their records and the finished
lines, the files' bytes beside it in `files/`.

A file's bytes are written (and synced) before its record: a record always has its bytes. A
finished line and its batch's counts change in one transaction, so after any crash the lines
recorded are exactly the lines counted, and a resumed batch runs only the others.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
  bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, key_id TEXT, endpoint TEXT NOT NULL,
  input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, metadata TEXT,
  status TEXT NOT NULL, errors TEXT, output_file_id TEXT, error_file_id TEXT,
  created_at INTEGER NOT NULL, expires_at INTEGER, in_progress_at INTEGER,
  finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, cancelling_at INTEGER,
  cancelled_at INTEGER, expired_at INTEGER, total INTEGER NOT NULL DEFAULT 0,
  completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS lines (
  batch_id TEXT NOT NULL, idx INTEGER NOT NULL, ok INTEGER NOT NULL, result TEXT NOT NULL,
  PRIMARY KEY (batch_id, idx));
"""
# The statuses a batch may be left in by a stop: the runner takes these up again at start.
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")
Row = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class BatchStore:
    """Thread-safe (one connection behind a lock): the service calls it off the event loop."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        (self.dir / "files").mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "batches.db", check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def _rows(self, sql: str, *args: Any) -> list[Row]:
        with self.lock:
            return [dict(r) for r in self.db.execute(sql, args).fetchall()]

    def _write(self, sql: str, *args: Any) -> int:
        with self.lock, self.db:
            return self.db.execute(sql, args).rowcount

    # -- files ---------------------------------------------------------------------------

    def add_file(self, tenant: str, filename: str, purpose: str, data: bytes) -> Row:
        file_id = new_id("file-")
        path = self.dir / "files" / file_id
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        row = {"id": file_id, "tenant": tenant, "filename": filename, "purpose": purpose,
               "bytes": len(data), "created_at": int(time.time())}  # fmt: skip
        self._insert("files", row)
        return row

    def _insert(self, table: str, row: Row) -> None:
        names = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        with self.lock, self.db:
            self.db.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", row)

    def file(self, file_id: str, tenant: str | None = None) -> Row | None:
        """The file's record; with `tenant`, only if it is that tenant's."""
        rows = self._rows("SELECT * FROM files WHERE id = ?", file_id)
        if not rows or (tenant is not None and rows[0]["tenant"] != tenant):
            return None
        return rows[0]

    def content(self, file_id: str) -> bytes:
        return (self.dir / "files" / file_id).read_bytes()

    def files(self, tenant: str, purpose: str | None = None) -> list[Row]:
        rows = self._rows("SELECT * FROM files WHERE tenant = ? ORDER BY created_at DESC", tenant)
        return [r for r in rows if purpose is None or r["purpose"] == purpose]

    def delete_file(self, file_id: str, tenant: str) -> bool:
        if not self._write("DELETE FROM files WHERE id = ? AND tenant = ?", file_id, tenant):
            return False
        (self.dir / "files" / file_id).unlink(missing_ok=True)
        return True

    # -- batches -------------------------------------------------------------------------

    def add_batch(self, row: Row) -> Row:
        row = {"id": new_id("batch_"), "status": "validating", "created_at": int(time.time()),
               **row}  # fmt: skip
        row["metadata"] = json.dumps(row.get("metadata"))
        self._insert("batches", row)
        found = self.batch(row["id"])
        assert found is not None
        return found

    def batch(self, batch_id: str, tenant: str | None = None) -> Row | None:
        rows = self._rows("SELECT * FROM batches WHERE id = ?", batch_id)
        if not rows or (tenant is not None and rows[0]["tenant"] != tenant):
            return None
        return rows[0]

    def batches(self, tenant: str | None) -> list[Row]:
        """The tenant's batches, newest first (None: every tenant's)."""
        order = " ORDER BY created_at DESC, rowid DESC"
        if tenant is None:
            return self._rows("SELECT * FROM batches" + order)
        return self._rows("SELECT * FROM batches WHERE tenant = ?" + order, tenant)

    def unfinished(self) -> list[Row]:
        marks = ", ".join("?" * len(UNFINISHED))
        return self._rows(f"SELECT * FROM batches WHERE status IN ({marks})", *UNFINISHED)

    def update(self, batch_id: str, **fields: Any) -> None:
        """Set `fields`; a `status` also stamps its `<status>_at` (but `validating`'s)."""
        if "status" in fields and fields["status"] != "validating":
            fields.setdefault(f"{fields['status']}_at", int(time.time()))
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        with self.lock, self.db:
            self.db.execute(f"UPDATE batches SET {sets} WHERE id = :id", {**fields, "id": batch_id})

    def set_status_unless(self, batch_id: str, status: str, unless: tuple[str, ...]) -> bool:
        """Move to `status` unless the batch is in one of `unless` (a cancel racing the end)."""
        marks = ", ".join("?" * len(unless))
        sql = f"UPDATE batches SET status = ?, {status}_at = ? WHERE id = ?"
        sql += f" AND status NOT IN ({marks})"
        return self._write(sql, status, int(time.time()), batch_id, *unless) > 0

    # -- lines ---------------------------------------------------------------------------

    def finish_line(self, batch_id: str, index: int, ok: bool, result: Row) -> None:
        count = "completed" if ok else "failed"
        with self.lock, self.db:
            self.db.execute(
                "INSERT INTO lines VALUES (?, ?, ?, ?)",
                (batch_id, index, int(ok), json.dumps(result, separators=(",", ":"))),
            )
            self.db.execute(f"UPDATE batches SET {count} = {count} + 1 WHERE id = ?", (batch_id,))

    def lines(self, batch_id: str) -> dict[int, tuple[bool, str]]:
        """The finished lines: index -> (succeeded, the output line as JSON)."""
        rows = self._rows("SELECT idx, ok, result FROM lines WHERE batch_id = ?", batch_id)
        return {r["idx"]: (bool(r["ok"]), r["result"]) for r in rows}
