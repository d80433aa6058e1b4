"""Deadlines of a request that travels on: sent again (a retry, a resumed stream) they keep
counting from its first arrival at the router; sent to another machine (a remote or Ray
replica) they go as the time left, since a monotonic clock means nothing there."""

from __future__ import annotations

import dataclasses
import time

from headrace.engine.frontend.client import GenerateOptions

MIN_TIMEOUT_S = 0.001  # what is left of a deadline that ran out on the way: it ends at once


def time_left(options: GenerateOptions, now: float | None = None) -> GenerateOptions:
    """The options with deadlines as the time left and no `arrival_time`, for another machine."""
    if options.arrival_time is None:
        return options
    spent = max((time.monotonic() if now is None else now) - options.arrival_time, 0.0)
    return dataclasses.replace(_less(options, spent), arrival_time=None)


def time_left_since(opts: GenerateOptions, t0: float) -> GenerateOptions:
    """The options of a retry: its deadlines still count from the first arrival. With an
    `arrival_time` they do already (and a remote replica's wire sends the time left)."""
    spent = time.monotonic() - t0
    if opts.arrival_time is not None or spent <= 0:
        return opts
    if opts.timeout_s is None and opts.queue_timeout_s is None:
        return opts
    return _less(opts, spent)


def _less(opts: GenerateOptions, spent: float) -> GenerateOptions:
    """Both deadlines `spent` seconds shorter, never below `MIN_TIMEOUT_S`."""

    def left(limit: float | None) -> float | None:
        return None if limit is None else max(limit - spent, MIN_TIMEOUT_S)

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
