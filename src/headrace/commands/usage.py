"""`headrace usage export`: the ledger's usage records for a billing system, as CSV or JSON
lines, oldest first (docs/ledger.md). Reads the file a server writes; safe while it runs (WAL)."""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from headrace.config import LedgerConfig
from headrace.ledger import store
from headrace.ledger.database import database_errors
from headrace.ledger.query import QueryError, UsageQuery, parse_time
from headrace.ledger.records import USAGE_COLUMNS
from headrace.ledger.setup import ledger_path

log = logging.getLogger("headrace.usage")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    export = sub.add_parser("export", help="write the usage records as CSV or JSON lines")
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument(
        "--ledger", help="the ledger file or postgresql:// URL (default: as `headrace serve`'s)"
    )
    export.add_argument("--start", help="from this time: Unix seconds or ISO 8601 (UTC)")
    export.add_argument("--end", help="up to (not including) this time")
    export.add_argument("--tenant", help="this tenant's records only")
    export.add_argument("--output", "-o", help="write here instead of standard output")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    refused: tuple[type[Exception], ...] = (QueryError, *database_errors())
    try:
        start, end = parse_time("start", args.start), parse_time("end", args.end)
        query = UsageQuery(start, end, args.tenant)
        db = store.connect(ledger_path(LedgerConfig(ledger=args.ledger)), create=False)
    except refused as e:
        log.error("%s", e)
        return 2
    try:
        rows = store.usage_rows(db, query)
        if args.output is None:
            write(rows, args.format, sys.stdout)
        else:
            with open(args.output, "w", encoding="utf-8", newline="") as out:
                write(rows, args.format, out)
    finally:
        db.close()
    return 0


def write(rows: Iterable[dict[str, Any]], fmt: str, out: TextIO) -> None:
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps(row) + "\n")
        return
    writer = csv.DictWriter(out, fieldnames=["id", *USAGE_COLUMNS], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
