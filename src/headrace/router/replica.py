"""One replica of a model as the router sees it: its engine client, its state, its live load.

A local replica is an engine-core process started by `starter` (and started again by the
supervisor after a failure); a remote one is a `RemoteEngine` that reconnects by itself.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from headrace.engine.frontend.client import EngineClient
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.router.load import LoadTracker
from headrace.router.policies import Candidate
from headrace.router.prefix_index import PrefixIndex

log = logging.getLogger("headrace.router")

Starter = Callable[[], Awaitable[EngineClient]]


class ReplicaState(enum.StrEnum):
    HEALTHY = "healthy"  # in rotation
    DOWN = "down"  # out of rotation: failed, or stopped answering
    RESTARTING = "restarting"  # out of rotation: a new engine is on its way
    DRAINING = "draining"  # out of rotation for good: the autoscaler removes it once idle


@dataclass(frozen=True)
class ReplicaInfo:
    """What stays true of a replica across restarts."""

    model_name: str
    max_model_len: int
    tokenizer: Tokenizer


class Replica:
    def __init__(
        self,
        name: str,
        engine: EngineClient,
        *,
        pool: str = "main",
        starter: Starter | None = None,
        url: str | None = None,
    ) -> None:
        self.name = name
        self.pool = pool  # "main" or "long"
        self.starter = starter  # None: cannot be restarted from here (remote)
        self.url = url
        self.engine = engine
        self.info = ReplicaInfo(engine.model_name, engine.max_model_len, engine.tokenizer)
        self.state = ReplicaState.HEALTHY
        self.load = LoadTracker(engine.stats())
        self.restarts = 0
        self.routed = 0  # requests dispatched here, retries included
        self.in_flight = 0
        self.last_error: str | None = None
        self.healthy_since = time.monotonic()
        self.restart_attempts = 0  # since it last stayed up for a while (sets the backoff)
        self.prefixes = PrefixIndex()  # what the router sent here: likely in its prefix cache
        self.adapters_in_memory: frozenset[str] = frozenset()  # as its last stats said

    @property
    def serving(self) -> bool:
        """In rotation: marked healthy, and the engine says so too (a dead core says at once)."""
        return self.state is ReplicaState.HEALTHY and self.engine.is_healthy

    @property
    def pid(self) -> int | None:
        return self.engine.pid

    def observe(self) -> None:
        stats = self.engine.stats()
        self.load.observe(stats)
        if stats.lora_adapters or self.adapters_in_memory:
            self.adapters_in_memory = frozenset(a[0] for a in stats.lora_adapters if a[1])

    def candidate(self, index: int, prefix_blocks: int = 0, lora: str | None = None) -> Candidate:
        self.observe()
        load = self.load
        holds = lora is not None and lora in self.adapters_in_memory
        return Candidate(
            index, load.load_tokens, load.free_blocks, self.in_flight, prefix_blocks, holds
        )

    # -- requests ---------------------------------------------------------------------------

    def dispatched(self, request_id: str, tokens: int) -> None:
        self.routed += 1
        self.in_flight += 1
        self.load.dispatched(request_id, tokens)

    def first_output(self, request_id: str) -> None:
        self.load.settle(request_id)

    def finished(self, request_id: str) -> None:
        self.in_flight -= 1
        self.load.settle(request_id)

    # -- lifecycle --------------------------------------------------------------------------

    def mark_down(self, reason: str) -> None:
        """Out of rotation at once; the supervisor restarts it (or waits for it, if remote)."""
        if self.state is not ReplicaState.HEALTHY:
            return
        log.error("replica %s is down: %s", self.name, reason)
        self.state = ReplicaState.DOWN
        self.last_error = reason

    def attach(self, engine: EngineClient) -> None:
        """A new engine (after a restart) joins the rotation."""
        self.engine = engine
        self.rejoin()

    def rejoin(self) -> None:
        log.warning("replica %s is back in rotation", self.name)
        self.load = LoadTracker(self.engine.stats())
        self.prefixes.clear()  # a restarted engine (or a remote back from failure) starts cold
        self.state = ReplicaState.HEALTHY
        self.healthy_since = time.monotonic()

    def kill(self) -> None:
        """Stop a replica that hangs: SIGKILL its core process (its streams then end)."""
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def describe(self) -> dict[str, object]:
        """For /health and /v1/stats."""
        self.observe()
        s = self.load.reported
        return {
            "name": self.name, "pool": self.pool, "state": str(self.state),
            "pid": self.pid, "url": self.url, "restarts": self.restarts, "routed": self.routed,
            "in_flight": self.in_flight, "load_tokens": self.load.load_tokens,
            "reported_tokens": self.load.reported_tokens,
            "pending_tokens": self.load.pending_tokens, "num_running": s.num_running,
            "num_waiting": s.num_waiting, "kv_blocks_used": s.kv_blocks_used,
            "kv_blocks_total": s.kv_blocks_total, "last_error": self.last_error,
            "prefix_blocks_routed": len(self.prefixes),
        }  # fmt: skip
