"""The ledger in an SQLite file (WAL: readers never wait for the writer): open and migrate it,
append batches, answer totals and export rows. Plain functions over a connection; the writer
thread owns one connection, each reader opens its own."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from headrace.ledger.query import UsageQuery
from headrace.ledger.records import AUDIT_COLUMNS, USAGE_COLUMNS, AuditEntry, UsageRecord
from headrace.ledger.schema import migrate

_INSERT_USAGE = (
    f"INSERT INTO usage ({', '.join(USAGE_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in USAGE_COLUMNS)})"
)
_INSERT_AUDIT = (
    f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in AUDIT_COLUMNS)})"
)
_BUSY_TIMEOUT_S = 10.0  # another server writing the same file holds its lock this long at most


def connect(path: str | Path, *, create: bool = True) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), the schema brought up to
    date; with `create=False` a missing file is an error (a reader must not make one)."""
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        raise FileNotFoundError(f"{path}: no ledger there")
    conn = sqlite3.connect(
        path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint, never torn
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    conn.row_factory = sqlite3.Row
    return conn


def append(
    conn: sqlite3.Connection, usage: Sequence[UsageRecord], audit: Sequence[AuditEntry]
) -> None:
    """Both batches in one transaction: all written or none."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(_INSERT_USAGE, [_usage_row(r) for r in usage])
        conn.executemany(_INSERT_AUDIT, [_audit_row(e) for e in audit])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def totals(conn: sqlite3.Connection, query: UsageQuery) -> list[dict[str, Any]]:
    """One row per tenant (and bucket, with `group_by`): requests and token sums."""
    sql, params = query.totals_sql()
    rows = []
    for row in conn.execute(sql, params):
        item = {k: v or 0 for k, v in dict(row).items() if k != "bucket"}
        item["tenant"] = row["tenant"]
        item["total_tokens"] = item["prompt_tokens"] + item["completion_tokens"]
        if query.group_by is not None:
            item[query.group_by] = row["bucket"]
        rows.append(item)
    return rows


def usage_rows(conn: sqlite3.Connection, query: UsageQuery) -> Iterator[dict[str, Any]]:
    """Every record in the range, oldest first (the export)."""
    where, params = query.where()
    sql = f"SELECT id, {', '.join(USAGE_COLUMNS)} FROM usage{where} ORDER BY id"
    for row in conn.execute(sql, params):
        item = dict(row)
        item["resumed"] = bool(item["resumed"])
        yield item


def audit_rows(
    conn: sqlite3.Connection, start: float | None, end: float | None, limit: int
) -> list[dict[str, Any]]:
    """The admin actions in the range, newest first, at most `limit`."""
    where, params = UsageQuery(start, end).where()
    sql = f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit{where} ORDER BY id DESC LIMIT ?"
    rows = []
    for row in conn.execute(sql, [*params, limit]):
        item = dict(row)
        item["arguments"] = json.loads(item["arguments"])
        item["result"] = json.loads(item["result"])
        rows.append(item)
    return rows


def _usage_row(r: UsageRecord) -> tuple[Any, ...]:
    return tuple(
        int(v) if isinstance(v, bool) else v for v in (getattr(r, c) for c in USAGE_COLUMNS)
    )


def _audit_row(e: AuditEntry) -> tuple[Any, ...]:
    values = {
        "arguments": json.dumps(dict(e.arguments), default=str),
        "result": json.dumps(dict(e.result), default=str),
    }
    return tuple(values.get(c, getattr(e, c)) for c in AUDIT_COLUMNS)
