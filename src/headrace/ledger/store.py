"""The ledger's reads and writes over a `Database`: open and migrate it, append batches,
answer totals and export rows. The writer thread owns one connection, each reader its own."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from headrace.ledger.database import Database, is_postgres
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

TEXT_LIMIT = 512


def connect(target: str | Path, *, create: bool = True) -> Database:
    """The ledger at `target` (a file, or a postgresql:// URL), its schema brought up to date;
    with `create=False` a missing SQLite file is an error."""
    db: Database
    if is_postgres(str(target)):
        from headrace.ledger.postgres_db import PostgresDatabase

        db = PostgresDatabase(str(target))
    else:
        from headrace.ledger.sqlite_db import SQLiteDatabase

        db = SQLiteDatabase(target, create)
    try:
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def append(db: Database, usage: Sequence[UsageRecord], audit: Sequence[AuditEntry]) -> None:
    """Both batches in one transaction: all written or none."""
    with db.transaction():
        if usage:
            db.executemany(_INSERT_USAGE, [_usage_row(r) for r in usage])
        if audit:
            db.executemany(_INSERT_AUDIT, [_audit_row(e) for e in audit])


def totals(db: Database, query: UsageQuery) -> list[dict[str, Any]]:
    """One row per tenant (and bucket, with `group_by`): requests and token sums."""
    sql, params = query.totals_sql(db.dialect)
    rows = []
    for row in db.execute(sql, params):
        item = {k: int(v or 0) for k, v in row.items() if k not in ("tenant", "bucket")}
        item["total_tokens"] = item["prompt_tokens"] + item["completion_tokens"]
        out: dict[str, Any] = {"tenant": row["tenant"], **item}
        if query.group_by is not None:
            out[query.group_by] = row["bucket"]
        rows.append(out)
    return rows


def usage_rows(db: Database, query: UsageQuery) -> Iterator[dict[str, Any]]:
    """Every record in the range, oldest first (the export)."""
    where, params = query.where()
    sql = f"SELECT id, {', '.join(USAGE_COLUMNS)} FROM usage{where} ORDER BY id"
    for item in db.execute(sql, params):
        item["resumed"] = bool(item["resumed"])
        yield item


def audit_rows(
    db: Database, start: float | None, end: float | None, limit: int
) -> list[dict[str, Any]]:
    """The admin actions in the range, newest first, at most `limit`."""
    where, params = UsageQuery(start, end).where()
    sql = f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit{where} ORDER BY id DESC LIMIT ?"
    rows = db.execute(sql, [*params, limit])
    for item in rows:
        item["arguments"] = json.loads(item["arguments"])
        item["result"] = json.loads(item["result"])
    return rows


def _usage_row(r: UsageRecord) -> tuple[Any, ...]:
    values = (getattr(r, c) for c in USAGE_COLUMNS)
    return tuple(int(v) if isinstance(v, bool) else _text(v) for v in values)


def _text(value: Any) -> Any:
    """A string as a column may hold it: no NUL (PostgreSQL refuses one, and a refused record
    would hold up every batch after it), at most TEXT_LIMIT characters (a caller's field)."""
    if not isinstance(value, str):
        return value
    return value.replace("\x00", "")[:TEXT_LIMIT]


def _audit_row(e: AuditEntry) -> tuple[Any, ...]:
    values = {
        "arguments": json.dumps(dict(e.arguments), default=str),
        "result": json.dumps(dict(e.result), default=str),
    }
    # the JSON columns whole (json.dumps writes no raw NUL), the others as `_text` keeps them
    return tuple(values[c] if c in values else _text(getattr(e, c)) for c in AUDIT_COLUMNS)
