"""The Ray actor that is one model replica: an `AsyncEngine` (its engine core in a child
process, as for a local replica) on whichever node Ray placed it.

The front end's `RayEngine` submits requests as token ids and collects every request's chunks
with one long-polled `pull` at a time: a batch per model step (for all the replica's streams,
with its stats) rather than a Ray object per token and request. One streaming generator of
such batches (`feed`) measured no better (docs/scale-out.md). Text is detokenized here, with
the tokenizer the replica loaded itself: only ids, text and stats cross the wire.

Several front ends may share one actor (`--ray-namespace`: a named, detached actor): each
pulls with its own `client` id and gets only its own requests' chunks; `start` loads the model
once whoever asks first; a front end that leaves calls `release`, and one that vanished is
forgotten after `CLIENT_TIMEOUT_S` without a pull (its requests cancelled).

Plain class: `ray_cluster` wraps it with `ray.remote(...)` and the resources it declares, so
that importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams

log = logging.getLogger("headrace.router")

CLIENT_TIMEOUT_S = 30.0  # a front end pulls every 0.5 s at least while it lives


@dataclass(frozen=True)
class ReplicaReady:
    """What the front end keeps of a started replica (sent once: the tokenizer with it)."""

    model_name: str
    max_model_len: int
    tokenizer: Tokenizer
    node_id: str
    node_ip: str
    settings: str = ""  # the configs it was created with: a front end that attaches compares


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


@dataclass
class _Outbox:
    """One front end's chunks not yet pulled."""

    items: list[GenerationChunk | Refusal] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    sent_stats: StepStats | None = None
    last_pull: float = field(default_factory=time.monotonic)


def settings_of(*configs: object) -> str:
    """What must match for a front end to attach to an existing actor."""
    return repr(configs)


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
        self._starting: asyncio.Task[ReplicaReady] | None = None
        self._outboxes: dict[str, _Outbox] = {}  # by front end
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}  # request -> (client, task)

    async def start(self) -> ReplicaReady:
        """Load the model (once: a second front end waits for the same start)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> ReplicaReady:
        import ray

        logging.basicConfig(level=logging.WARNING)
        self._engine = await AsyncEngine.start(*self._configs, served_model_name=self._name)
        ctx = ray.get_runtime_context()
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        engine = self._engine
        return ReplicaReady(
            engine.model_name, engine.max_model_len, engine.tokenizer, ctx.get_node_id(),
            node_ip, settings_of(*self._configs, self._name),
        )  # fmt: skip

    async def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions,
        client: str = "",
    ) -> None:
        if request_id in self._tasks:
            message = f"request id {request_id!r} is already in use"
            self._put(client, Refusal(request_id, message))
            return
        task = asyncio.create_task(self._run(client, request_id, prompt_ids, params, options))
        self._tasks[request_id] = (client, task)

    async def cancel(self, request_id: str) -> None:
        """The caller left: stop reading, which aborts the request in the core."""
        entry = self._tasks.get(request_id)
        if entry is not None:
            entry[1].cancel()

    async def release(self, client: str) -> None:
        """Front end `client` leaves: cancel its requests, drop its outbox."""
        self._drop(client)

    async def abort(self, request_id: str) -> None:
        """End it with an `abort` chunk (the caller still reads)."""
        await self._require_engine().abort(request_id)

    async def pull(self, wait_s: float, client: str = "") -> Pulled:
        box = self._outboxes.get(client)
        if box is None:
            box = self._outboxes[client] = _Outbox()
        if not box.items:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.wake.wait(), wait_s)
        box.wake.clear()
        box.last_pull = time.monotonic()
        items, box.items = box.items, []
        self._forget_silent_clients(box.last_pull)
        engine = self._require_engine()
        failure = None if engine.is_healthy else "its engine core is gone"
        stats = engine.stats()
        if stats is box.sent_stats:
            return Pulled(items, None, failure)
        box.sent_stats = stats
        return Pulled(items, stats, failure)

    async def feed(self, wait_s: float, client: str = "") -> AsyncIterator[Pulled]:
        """`pull` after `pull`, as one streaming generator: no task round trip per batch."""
        while True:
            yield await self.pull(wait_s, client)

    async def close(self) -> None:
        for _, task in list(self._tasks.values()):
            task.cancel()
        if self._engine is not None:
            await self._engine.close()

    # -- helpers ----------------------------------------------------------------------------

    async def _run(
        self,
        client: str,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions,
    ) -> None:
        engine = self._require_engine()
        try:
            async for chunk in engine.generate(request_id, prompt_ids, params, options):
                self._put(client, chunk)
        except ValueError as e:
            self._put(client, Refusal(request_id, str(e)))
        except Exception as e:  # the request's own failure: its stream ends with an error
            log.exception("request %s failed in the replica actor", request_id)
            failed = GenerationChunk(request_id, "", [], FinishReason.ERROR, error=str(e))
            self._put(client, failed)
        finally:
            self._tasks.pop(request_id, None)

    def _put(self, client: str, item: GenerationChunk | Refusal) -> None:
        box = self._outboxes.get(client)
        if box is None:  # news before its first pull (or after it left: forgotten later)
            box = self._outboxes[client] = _Outbox()
        box.items.append(item)
        box.wake.set()

    def _forget_silent_clients(self, now: float) -> None:
        """A front end that stopped pulling (killed, cut off) leaves no requests running."""
        for client, box in list(self._outboxes.items()):
            if now - box.last_pull > CLIENT_TIMEOUT_S:
                log.warning("front end %s stopped pulling: cancelling its requests", client)
                self._drop(client)

    def _drop(self, client: str) -> None:
        self._outboxes.pop(client, None)
        for owner, task in list(self._tasks.values()):
            if owner == client:
                task.cancel()

    def _require_engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the replica actor has not started")
        return self._engine
