"""What the ledger needs of a database, SQLite or PostgreSQL: statements with `?` parameters
and rows as dicts, transactions, and the few SQL spellings that differ (`Dialect`)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class Dialect:
    name: str
    id_column: str  # an auto-numbered primary key
    day: str  # a Unix time column `time` as its UTC day, YYYY-MM-DD
    hour: str  # ... as its UTC hour, YYYY-MM-DDTHH:00:00Z
    placeholder: str = "?"

    def sql(self, text: str) -> str:
        """`text` with its `?` parameters spelled as this database wants them."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)


SQLITE = Dialect(
    "sqlite", "INTEGER PRIMARY KEY",
    "strftime('%Y-%m-%d', time, 'unixepoch')", "strftime('%Y-%m-%dT%H:00:00Z', time, 'unixepoch')",
)  # fmt: skip
_UTC = "to_timestamp(time) AT TIME ZONE 'UTC'"
POSTGRES = Dialect(
    "postgresql", "BIGSERIAL PRIMARY KEY",
    f"to_char({_UTC}, 'YYYY-MM-DD')", f"to_char({_UTC}, 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')", "%s",
)  # fmt: skip


class Database(Protocol):
    """A connection, in autocommit mode but inside `transaction()`; used by one thread."""

    dialect: Dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run `sql` (`?` parameters); its rows, if any, as dicts."""
        ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def transaction(self, exclusive: bool = False) -> contextlib.AbstractContextManager[None]:
        """All of the block or none of it; `exclusive`: one such block at a time across every
        connection (migrations)."""
        ...

    def close(self) -> None: ...


def is_postgres(target: str) -> bool:
    return target.startswith(POSTGRES_SCHEMES)


def describe(target: str) -> str:
    """`target` for a log line: a URL without its user and password."""
    if not is_postgres(target):
        return target
    parts = urlsplit(target)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@contextlib.contextmanager
def statements(db: Database, begin: str) -> Iterator[None]:
    """`begin`, the block, then COMMIT (ROLLBACK if it raised)."""
    db.execute(begin)
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def database_errors() -> tuple[type[Exception], ...]:
    """What a failing database raises (a missing file or directory, a full disk, a lost
    connection, no driver): the callers answer these, never a request's outcome."""
    errors: tuple[type[Exception], ...] = (OSError, sqlite3.Error, RuntimeError)
    try:
        import psycopg
    except ImportError:
        return errors
    return (*errors, psycopg.Error)
