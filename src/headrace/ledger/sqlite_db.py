"""The ledger in an SQLite file, in WAL mode: readers never wait for the writer, and several
servers on one host may share the file (a busy timeout, migrations under a write lock)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headrace.ledger.database import SQLITE, statements

_BUSY_TIMEOUT_S = 10.0  # another server writing the same file holds its lock this long at most


class SQLiteDatabase:
    dialect = SQLITE

    def __init__(self, path: str | Path, create: bool = True) -> None:
        """With `create=False` a missing file is an error (a reader must not make one)."""
        path = Path(path)
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.exists():
            raise FileNotFoundError(f"{path}: no ledger there")
        self.conn = sqlite3.connect(
            path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints, never torn
        except BaseException:
            self.conn.close()
            raise

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self.conn.execute(sql, params)]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def transaction(self, exclusive: bool = False) -> contextlib.AbstractContextManager[None]:
        # IMMEDIATE takes the write lock at once: every write transaction is exclusive here
        return statements(self, "BEGIN IMMEDIATE")

    def close(self) -> None:
        self.conn.close()
