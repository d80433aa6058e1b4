"""The server's ledger from its settings: where it lives, and a first look at it at start."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headrace.config import LedgerConfig
from headrace.ledger import store
from headrace.ledger.database import database_errors, describe, is_postgres
from headrace.ledger.records import AuditEntry, redact
from headrace.ledger.schema import LedgerVersionError
from headrace.ledger.writer import Ledger
from headrace.paths import state_root

log = logging.getLogger("headrace.ledger")


def ledger_path(cfg: LedgerConfig) -> str:
    """A file, or a postgresql:// URL; the default is a file in the state directory."""
    if cfg.ledger and is_postgres(cfg.ledger):
        return cfg.ledger
    return str(Path(cfg.ledger) if cfg.ledger else state_root() / "ledger.db")


def open_ledger(cfg: LedgerConfig) -> Ledger | None:
    """The ledger, or None with `--no-ledger`. A ledger of a newer schema stops the start
    (ValueError); one that cannot be opened now is logged and tried again at each flush (the
    server serves meanwhile, holding the records)."""
    if not cfg.enabled:
        return None
    path = ledger_path(cfg)
    try:
        store.connect(path).close()  # creates and migrates it
    except LedgerVersionError as e:
        raise ValueError(f"{describe(path)}: {e}") from e
    except database_errors() as e:
        name = describe(path)
        log.error("cannot open the ledger %s now (records are held and retried): %s", name, e)
    return Ledger(path, cfg.ledger_flush_s, cfg.ledger_max_pending, spill_path(path))


def spill_path(target: str) -> Path:
    """The spill file of a ledger (spill.py): beside an SQLite file; for a PostgreSQL URL, in
    the state directory, named by the URL's digest (front ends that share the directory and
    the database share the file, under its lock)."""
    if not is_postgres(target):
        return Path(target + ".spill.jsonl")
    digest = hashlib.sha256(target.encode()).hexdigest()[:12]
    return state_root() / f"ledger-spill-{digest}.jsonl"


def record_action(
    ledger: str | None,
    action: str,
    arguments: Mapping[str, Any],
    status: int,
    result: Mapping[str, Any],
) -> None:
    """An admin action taken outside a server (a command), straight into the audit log at
    `ledger` (as `--ledger`); a failure to record it is logged, never raised."""
    cfg = LedgerConfig(ledger=ledger)
    if not cfg.enabled:
        return
    entry = AuditEntry(action, None, redact(arguments), status, result)
    try:
        db = store.connect(ledger_path(cfg))
        try:
            store.append(db, [], [entry])
        finally:
            db.close()
    except database_errors() as e:
        log.error("%s was not recorded in the audit log: %s", action, e)
