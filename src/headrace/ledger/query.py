"""A question put to the ledger: a time range, a tenant, a grouping; and its answer's SQL."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from headrace.ledger.database import Dialect

# how rows are bucketed (times: Unix seconds; day and hour: UTC); model and adapter are columns
GROUPS = ("day", "hour", "model", "adapter")
TOTALS = (
    "COUNT(*) AS requests, SUM(prompt_tokens) AS prompt_tokens, "
    "SUM(cached_tokens) AS cached_tokens, SUM(completion_tokens) AS completion_tokens, "
    "SUM(recomputed_tokens) AS recomputed_tokens, SUM(draft_tokens) AS draft_tokens, "
    "SUM(accepted_tokens) AS accepted_tokens, "
    "SUM(CASE WHEN http_status >= 400 THEN 1 ELSE 0 END) AS errors"
)


class QueryError(ValueError):
    """A bad parameter; the message names it and says what is expected."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def parse_time(param: str, text: str | None) -> float | None:
    """Unix seconds, or an ISO 8601 date or time (UTC unless it says otherwise)."""
    if text is None or text == "":
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise QueryError(param, f"{param}: {text!r} is not a finite time")
        return seconds
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(
            param, f"{param}: {text!r} is neither Unix seconds nor an ISO 8601 date or time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True)
class UsageQuery:
    start: float | None = None  # inclusive
    end: float | None = None  # exclusive
    tenant: str | None = None  # None: every tenant
    group_by: str | None = None  # day | hour | model | adapter; None: one row per tenant

    def __post_init__(self) -> None:
        if self.group_by is not None and self.group_by not in GROUPS:
            raise QueryError("group_by", f"group_by must be one of {', '.join(GROUPS)}")
        if self.start is not None and self.end is not None and self.end < self.start:
            raise QueryError("end", "end is before start")

    def where(self) -> tuple[str, list[Any]]:
        """The WHERE clause (or '') and its parameters."""
        terms, params = [], []
        for term, value in (
            ("time >= ?", self.start), ("time < ?", self.end), ("tenant = ?", self.tenant)
        ):  # fmt: skip
            if value is not None:
                terms.append(term)
                params.append(value)
        return (" WHERE " + " AND ".join(terms) if terms else ""), params

    def totals_sql(self, dialect: Dialect) -> tuple[str, list[Any]]:
        times = {"day": dialect.day, "hour": dialect.hour}
        bucket = times.get(self.group_by, self.group_by) if self.group_by else "NULL"
        where, params = self.where()
        sql = (
            f"SELECT tenant, {bucket} AS bucket, {TOTALS} FROM usage{where} "
            "GROUP BY tenant, bucket ORDER BY tenant, bucket NULLS FIRST"  # the base model's first
        )
        return sql, params
