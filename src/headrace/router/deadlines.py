"""Deadlines of a request sent again (a retry, a resumed stream): they keep counting from its
first arrival at the router."""

from __future__ import annotations

import dataclasses
import time

from headrace.engine.frontend.client import GenerateOptions

_MIN_TIMEOUT_S = 0.001


def time_left_since(opts: GenerateOptions, t0: float) -> GenerateOptions:
    """The options of a retry: its deadlines still count from the first arrival. With an
    `arrival_time` they do already (and a remote replica's wire sends the time left)."""
    spent = time.monotonic() - t0
    if opts.arrival_time is not None or spent <= 0:
        return opts
    if opts.timeout_s is None and opts.queue_timeout_s is None:
        return opts

    def left(limit: float | None) -> float | None:
        return None if limit is None else max(limit - spent, _MIN_TIMEOUT_S)

    return dataclasses.replace(
        opts, timeout_s=left(opts.timeout_s), queue_timeout_s=left(opts.queue_timeout_s)
    )


def deadline_of(opts: GenerateOptions, t0: float) -> float | None:
    """When the whole request times out (`time.monotonic()`), counted from its arrival (or
    from `t0`, its arrival at the router); None: it has no timeout."""
    if opts.timeout_s is None:
        return None
    start = opts.arrival_time if opts.arrival_time is not None else t0
    return start + opts.timeout_s
