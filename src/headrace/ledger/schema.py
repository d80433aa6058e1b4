"""The ledger's tables, built by numbered migrations; `schema_version` says which have run.

A migration is only ever appended (never edited once released): a ledger written by an older
server is brought up to date by running the ones it lacks, in order. The same statements serve
SQLite and PostgreSQL (`{id}`: the dialect's auto-numbered key; DOUBLE PRECISION is SQLite's
REAL).
"""

from __future__ import annotations

import time

from headrace.ledger.database import Database, database_errors

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: usage and audit
        """CREATE TABLE usage (
            id {id},
            time DOUBLE PRECISION NOT NULL, tenant TEXT NOT NULL, key_id TEXT, model TEXT,
            route TEXT NOT NULL, request_id TEXT, http_status INTEGER NOT NULL,
            finish_reason TEXT, n INTEGER NOT NULL,
            prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL, recomputed_tokens INTEGER NOT NULL,
            draft_tokens INTEGER NOT NULL, accepted_tokens INTEGER NOT NULL,
            queue_s DOUBLE PRECISION, ttft_s DOUBLE PRECISION, total_s DOUBLE PRECISION,
            replica TEXT, resumed INTEGER NOT NULL
        )""",
        "CREATE INDEX usage_time ON usage (time)",
        "CREATE INDEX usage_tenant_time ON usage (tenant, time)",
        """CREATE TABLE audit (
            id {id},
            time DOUBLE PRECISION NOT NULL, key_id TEXT, action TEXT NOT NULL,
            arguments TEXT NOT NULL, status INTEGER NOT NULL, result TEXT NOT NULL
        )""",
        "CREATE INDEX audit_time ON audit (time)",
    ),
    (  # 2: the LoRA adapter a request named (`model` is then its base); NULL in older rows
        "ALTER TABLE usage ADD COLUMN adapter TEXT",
    ),
)
VERSION = len(MIGRATIONS)


class LedgerVersionError(RuntimeError):
    """The ledger was written by a newer Headrace: this one does not know its schema."""


def migrate(db: Database) -> int:
    """Run the migrations `db` lacks; returns its version after. One exclusive transaction:
    two servers starting on one ledger at once migrate it once. An up-to-date ledger (every
    reader's case) is only looked at: no write lock is taken."""
    if _version(db) == VERSION:
        return VERSION
    with db.transaction(exclusive=True):
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, applied DOUBLE PRECISION)"
        )
        have = int(db.execute("SELECT MAX(version) AS v FROM schema_version")[0]["v"] or 0)
        if have > VERSION:
            raise LedgerVersionError(
                f"the ledger has schema version {have}; this Headrace knows up to {VERSION}"
            )
        for number in range(have + 1, VERSION + 1):
            for statement in MIGRATIONS[number - 1]:
                db.execute(statement.replace("{id}", db.dialect.id_column))
            db.execute("INSERT INTO schema_version VALUES (?, ?)", (number, time.time()))
    return VERSION


def _version(db: Database) -> int | None:
    """The ledger's version, read without a lock; None before the first migration."""
    try:
        rows = db.execute("SELECT MAX(version) AS v FROM schema_version")
    except database_errors():
        return None
    return int(rows[0]["v"] or 0)
