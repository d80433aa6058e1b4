"""The Ray actor that is one model replica: an `AsyncEngine` (its engine core in a child
process, as for a local replica) on whichever node Ray placed it.

The front end's `RayEngine` submits requests as token ids and collects every request's chunks
with one long-polled `pull` at a time: a batch per model step (for all the replica's streams,
with its stats) rather than a Ray object per token and request. One streaming generator of
such batches (`feed`) measured no better (docs/scale-out.md). Text is detokenized here, with
the tokenizer the replica loaded itself: only ids, text and stats cross the wire.

Plain class: `ray_cluster` wraps it with `ray.remote(...)` and the resources it declares, so
that importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.async_engine import AsyncEngine
from headrace.engine.client import GenerateOptions, GenerationChunk
from headrace.engine.outputs import StepStats
from headrace.request import FinishReason, SamplingParams

log = logging.getLogger("headrace.router")


@dataclass(frozen=True)
class ReplicaReady:
    """What the front end keeps of a started replica (sent once: the tokenizer with it)."""

    model_name: str
    max_model_len: int
    tokenizer: Any
    node_id: str
    node_ip: str


@dataclass(frozen=True)
class Refusal:
    """The request can never fit (or an option is out of range): a ValueError at the caller."""

    request_id: str
    message: str


@dataclass(frozen=True)
class Pulled:
    """Everything since the previous pull, in order; `stats` None when unchanged; `failure`
    set once the replica's engine core is gone (its streams then end with errors)."""

    items: list[GenerationChunk | Refusal] = field(default_factory=list)
    stats: StepStats | None = None
    failure: str | None = None


class ReplicaActor:
    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        scheduler_config: SchedulerConfig,
        served_model_name: str,
    ) -> None:
        self._configs = (model_config, cache_config, scheduler_config)
        self._name = served_model_name
        self._engine: AsyncEngine | None = None
        self._outbox: list[GenerationChunk | Refusal] = []
        self._wake: asyncio.Event | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sent_stats: StepStats | None = None

    async def start(self) -> ReplicaReady:
        import ray

        logging.basicConfig(level=logging.WARNING)
        self._wake = asyncio.Event()
        self._engine = await AsyncEngine.start(*self._configs, served_model_name=self._name)
        ctx = ray.get_runtime_context()
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        engine = self._engine
        return ReplicaReady(
            engine.model_name, engine.max_model_len, engine.tokenizer, ctx.get_node_id(), node_ip
        )

    async def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions,
    ) -> None:
        if request_id in self._tasks:
            self._put(Refusal(request_id, f"request id {request_id!r} is already in use"))
            return
        task = asyncio.create_task(self._run(request_id, prompt_ids, params, options))
        self._tasks[request_id] = task

    async def cancel(self, request_id: str) -> None:
        """The caller left: stop reading, which aborts the request in the core."""
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def abort(self, request_id: str) -> None:
        """End it with an `abort` chunk (the caller still reads)."""
        await self._require_engine().abort(request_id)

    async def pull(self, wait_s: float) -> Pulled:
        assert self._wake is not None
        if not self._outbox:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
        self._wake.clear()
        items, self._outbox = self._outbox, []
        engine = self._require_engine()
        failure = None if engine.is_healthy else "its engine core is gone"
        stats = engine.stats()
        if stats is self._sent_stats:
            return Pulled(items, None, failure)
        self._sent_stats = stats
        return Pulled(items, stats, failure)

    async def feed(self, wait_s: float) -> AsyncIterator[Pulled]:
        """`pull` after `pull`, as one streaming generator: no task round trip per batch."""
        while True:
            yield await self.pull(wait_s)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._engine is not None:
            await self._engine.close()

    # -- helpers ----------------------------------------------------------------------------

    async def _run(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions,
    ) -> None:
        engine = self._require_engine()
        try:
            async for chunk in engine.generate(request_id, prompt_ids, params, options):
                self._put(chunk)
        except ValueError as e:
            self._put(Refusal(request_id, str(e)))
        except Exception as e:  # the request's own failure: its stream ends with an error
            log.exception("request %s failed in the replica actor", request_id)
            self._put(GenerationChunk(request_id, "", [], FinishReason.ERROR, error=str(e)))
        finally:
            self._tasks.pop(request_id, None)

    def _put(self, item: GenerationChunk | Refusal) -> None:
        self._outbox.append(item)
        assert self._wake is not None
        self._wake.set()

    def _require_engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the replica actor has not started")
        return self._engine
