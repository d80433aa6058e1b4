"""The ledger's tables, built by numbered migrations; `schema_version` says which have run.

A migration is only ever appended (never edited once released): a ledger written by an older
server is brought up to date by running the ones it lacks, in order.
"""

from __future__ import annotations

import sqlite3
import time

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: usage and audit
        """CREATE TABLE usage (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL, tenant TEXT NOT NULL, key_id TEXT, model TEXT,
            route TEXT NOT NULL, request_id TEXT, http_status INTEGER NOT NULL,
            finish_reason TEXT, n INTEGER NOT NULL,
            prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL, recomputed_tokens INTEGER NOT NULL,
            draft_tokens INTEGER NOT NULL, accepted_tokens INTEGER NOT NULL,
            queue_s REAL, ttft_s REAL, total_s REAL, replica TEXT, resumed INTEGER NOT NULL
        )""",
        "CREATE INDEX usage_time ON usage (time)",
        "CREATE INDEX usage_tenant_time ON usage (tenant, time)",
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL, key_id TEXT, action TEXT NOT NULL,
            arguments TEXT NOT NULL, status INTEGER NOT NULL, result TEXT NOT NULL
        )""",
        "CREATE INDEX audit_time ON audit (time)",
    ),
)
VERSION = len(MIGRATIONS)


class LedgerVersionError(RuntimeError):
    """The ledger was written by a newer Headrace: this one does not know its schema."""


def current_version(conn: sqlite3.Connection) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied REAL)"
    )
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection) -> int:
    """Run the migrations `conn`'s database lacks (`conn` in autocommit mode); returns its
    version after. One write-locked transaction: two servers starting on one file at once
    migrate it once."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        have = current_version(conn)
        if have > VERSION:
            raise LedgerVersionError(
                f"the ledger has schema version {have}; this Headrace knows up to {VERSION}"
            )
        for number in range(have + 1, VERSION + 1):
            for statement in MIGRATIONS[number - 1]:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, ?)", (number, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return VERSION
