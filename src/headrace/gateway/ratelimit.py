"""Per-tenant limits: tokens per minute (a token bucket) and requests in flight.

A request reserves prompt + max_tokens from the bucket when admitted and is refunded exactly
what it did not use when it ends, so a tenant is charged for the tokens it consumed, but can
never have more in flight than its budget. The clock is injected so tests can step time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from headrace.gateway.errors import duration, rate_limited

Clock = Callable[[], float]

# Weight of a new request's duration in the running average used for concurrency Retry-After.
_DURATION_EMA = 0.2


class Bucket(Protocol):
    """A tenant's tokens: its own `TokenBucket`, or a lease of one that front ends share
    (`gateway.lease.Lease`)."""

    capacity: float

    def level(self) -> float: ...
    def wait_for(self, n: float) -> float: ...
    def take(self, n: float) -> None: ...
    def give(self, n: float) -> None: ...
    def reset_in(self) -> float: ...


class TokenBucket:
    """Holds up to `capacity` tokens, refilled at `capacity` per `period_s`.

    The level may go below zero only when a request used more than it reserved (it cannot,
    through the gateway), which then delays the next admission instead of being forgotten.
    """

    def __init__(self, capacity: int, clock: Clock, period_s: float = 60.0) -> None:
        self.capacity = float(capacity)
        self.rate = capacity / period_s  # tokens per second
        self.clock = clock
        self._level = float(capacity)
        self._updated = clock()

    def level(self) -> float:
        now = self.clock()
        self._level = min(self.capacity, self._level + (now - self._updated) * self.rate)
        self._updated = now
        return self._level

    def wait_for(self, n: float) -> float:
        """Seconds until `n` tokens are available (0 if they are now)."""
        return max(0.0, (n - self.level()) / self.rate)

    def take(self, n: float) -> None:
        self._level = self.level() - n

    def give(self, n: float) -> None:
        self._level = min(self.capacity, self.level() + n)

    def reset_in(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level()) / self.rate)


class TenantLimiter:
    """One tenant's limits. `check` is the cheap pre-check before tokenizing; `reserve`
    admits a request of known size; `settle` ends it and refunds the unused tokens."""

    def __init__(
        self,
        name: str,
        tokens_per_minute: int | None,
        max_concurrent: int | None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.name = name
        self.clock = clock
        self.tokens_per_minute = tokens_per_minute
        self.max_concurrent = max_concurrent
        self.bucket: Bucket | None = None
        if tokens_per_minute:
            self.bucket = TokenBucket(tokens_per_minute, clock)
        # how many may be in flight now: a lease of a shared limit replaces it
        self.concurrency_cap: Callable[[], int | None] = lambda: max_concurrent
        self.in_flight: dict[int, float] = {}  # ticket -> admission time
        self.avg_duration_s: float | None = None

    def update(self, tokens_per_minute: int | None, max_concurrent: int | None) -> bool:
        """New limits from a reloaded tenants file, for the requests admitted from now on;
        those in flight keep their reservations (refunds go to the new bucket). Tokens spent
        in the last minute stay spent. False if nothing changed."""
        if (tokens_per_minute, max_concurrent) == (self.tokens_per_minute, self.max_concurrent):
            return False
        spent = self.bucket.capacity - self.bucket.level() if self.bucket is not None else 0.0
        self.tokens_per_minute, self.max_concurrent = tokens_per_minute, max_concurrent
        self.bucket = TokenBucket(tokens_per_minute, self.clock) if tokens_per_minute else None
        if isinstance(self.bucket, TokenBucket):
            self.bucket.take(min(self.bucket.capacity, max(0.0, spent)))
        self.concurrency_cap = lambda: max_concurrent
        return True

    def check(self, tokens: int = 1) -> None:
        """Raise 429 if a request of `tokens` (prompt + max_tokens) could not start now; with
        the default of 1 it is the cheap pre-check before tokenizing."""
        self._check_concurrency()
        if self.bucket is None:
            return
        if tokens > self.bucket.capacity:
            # Retrying cannot help: no Retry-After, and the message says what to change.
            raise rate_limited(
                f"request needs {tokens} tokens (prompt + max_tokens), more than tenant "
                f"{self.name!r}'s limit of {self.tokens_per_minute} tokens per minute; "
                "lower max_tokens",
                None,
                self.headers(),
            )
        wait = self.bucket.wait_for(tokens)
        if wait > 0:
            raise rate_limited(
                f"tenant {self.name!r} is over its limit of {self.tokens_per_minute} tokens per "
                f"minute ({self.remaining()} left, this request needs {tokens}); "
                f"retry in {wait:.1f} s",
                wait,
                self.headers(),
            )

    def reserve(self, ticket: int, tokens: int) -> dict[str, str]:
        """Take `tokens` for request `ticket` (or raise 429); returns the x-ratelimit headers."""
        self.check(tokens)
        if self.bucket is not None:
            self.bucket.take(tokens)
        self.in_flight[ticket] = self.clock()
        return self.headers()

    def settle(self, ticket: int, reserved: int, used: int) -> None:
        """Request `ticket` ended having used `used` of its `reserved` tokens."""
        started = self.in_flight.pop(ticket, None)
        if started is None:
            return  # settled already: refunding twice would mint tokens
        took = self.clock() - started
        avg = self.avg_duration_s
        self.avg_duration_s = took if avg is None else avg + _DURATION_EMA * (took - avg)
        if self.bucket is not None:
            self.bucket.give(reserved - used)

    def remaining(self) -> int | None:
        return None if self.bucket is None else max(0, int(self.bucket.level()))

    def headers(self) -> dict[str, str]:
        if self.bucket is None:
            return {}
        return {
            "x-ratelimit-limit-tokens": str(self.tokens_per_minute),
            "x-ratelimit-remaining-tokens": str(self.remaining()),
            "x-ratelimit-reset-tokens": duration(self.bucket.reset_in()),
        }

    def _check_concurrency(self) -> None:
        cap = self.concurrency_cap()
        if cap is None or len(self.in_flight) < cap:
            return
        wait = self._concurrency_wait()
        raise rate_limited(
            f"tenant {self.name!r} already has {len(self.in_flight)} requests in flight, its "
            f"limit is {self.max_concurrent}; retry in {wait:.1f} s",
            wait,
            self.headers(),
        )

    def _concurrency_wait(self) -> float:
        """When the oldest request in flight should end, judged by past durations."""
        if self.avg_duration_s is None:
            return 1.0
        oldest_age = self.clock() - min(self.in_flight.values())
        return max(0.05, self.avg_duration_s - oldest_age)
