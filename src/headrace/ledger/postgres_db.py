"""The ledger in PostgreSQL, for several front ends sharing one (`--ledger postgresql://...`).
Needs the `postgres` extra (psycopg 3)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from headrace.ledger.database import POSTGRES

_LOCK_ID = 0x6865616472  # the advisory lock that migrations take ("headr")
_CONNECT_TIMEOUT_S = 10


class PostgresDatabase:
    dialect = POSTGRES

    def __init__(self, url: str) -> None:
        try:
            import psycopg
            from psycopg.rows import dict_row
        except ImportError as e:
            raise RuntimeError(
                "a PostgreSQL ledger needs psycopg: pip install 'headrace[postgres]'"
            ) from e
        self.conn: Any = psycopg.connect(
            url, autocommit=True, row_factory=dict_row, connect_timeout=_CONNECT_TIMEOUT_S
        )

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cur = self.conn.execute(POSTGRES.sql(sql), params)
        return list(cur.fetchall()) if cur.description is not None else []

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(POSTGRES.sql(sql), rows)

    @contextlib.contextmanager
    def transaction(self, exclusive: bool = False) -> Iterator[None]:
        with self.conn.transaction():
            if exclusive:  # held to the end of the transaction
                self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            yield

    def close(self) -> None:
        self.conn.close()
