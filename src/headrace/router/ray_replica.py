"""A replica that is a Ray actor (`ray_actor.ReplicaActor`) somewhere in the cluster: an
`EngineClient` for the router, beside local processes and remote servers.

One pull loop per replica asks the actor for everything new (`pull`, long-polled: it answers
at once when a chunk is waiting, else after `PULL_WAIT_S` with the stats) and hands each chunk
to its request's queue. The stats of every answer are the router's load reports; an idle
actor still answers every `PULL_WAIT_S`, so the supervisor's stall timeout sees one that hangs.

A Ray error on any call (the actor died, its node left the cluster) makes the replica unhealthy
at once and ends every open stream with an error chunk: the router takes it out of rotation and
sends the requests that had not streamed anything to another replica. The supervisor then
closes it (killing the actor, if it still lives) and starts a new one wherever Ray finds room.

A shared replica (a named actor other front ends use too, `--ray-namespace`) is left running
when this front end closes it in good health: only its own requests are cancelled there. One
that failed, or has not answered for `STALE_S` (a hung actor the supervisor gave up on), is
killed as before, so that the next start (ours or another front end's) creates a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams
from headrace.router.deadlines import time_left
from headrace.router.ray_actor import Pulled, Refusal, ReplicaReady

log = logging.getLogger("headrace.router")

PULL_WAIT_S = 0.5  # as an idle local core's stats interval
# "feed": one streaming generator of batches per replica instead of a task per batch (measured
# no better: docs/scale-out.md)
TRANSPORT_ENV = "HEADRACE_RAY_TRANSPORT"
STALE_S = 5.0  # ten pulls unanswered: a shared actor this quiet is killed, not left to others

_Item = GenerationChunk | Refusal


class RayEngine:
    """Use `await RayEngine.start(actor)` with a freshly created (or a shared) actor handle."""

    def __init__(self, actor: Any, ready: ReplicaReady, shared: bool = False) -> None:
        self._actor = actor
        self.ready = ready
        self.shared = shared
        self._client = uuid.uuid4().hex[:12]  # this front end, to the actor
        self._answered_at = time.monotonic()
        self._streams: dict[str, asyncio.Queue[_Item]] = {}
        self._stats = StepStats()
        self._failure: str | None = None
        self._closed = False
        self._puller: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, actor: Any, shared: bool = False) -> RayEngine:
        """Wait for the actor's model to load (however long Ray takes to place it)."""
        ready: ReplicaReady = await actor.start.remote()
        engine = cls(actor, ready, shared)
        engine._puller = asyncio.create_task(engine._pull_loop(), name="headrace-ray-pull")
        return engine

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.ready.model_name

    @property
    def max_model_len(self) -> int:
        return self.ready.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self.ready.tokenizer

    @property
    def failure(self) -> str | None:
        """Why it is not healthy (None when it is)."""
        return "closed" if self._closed else self._failure

    @property
    def is_healthy(self) -> bool:
        return not self._closed and self._failure is None

    @property
    def pid(self) -> int | None:
        return None  # in a Ray actor, maybe on another machine

    def describe(self) -> dict[str, object]:
        return {"node_id": self.ready.node_id, "node_ip": self.ready.node_ip}

    @property
    def num_open_requests(self) -> int:
        return len(self._streams)

    def stats(self) -> StepStats:
        return self._stats

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not self.is_healthy:
            yield _error(request_id, f"Ray replica is down: {self.failure}")
            return
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._streams[request_id] = queue
        opts = time_left(options or GenerateOptions())  # another machine's clock
        finished = False
        try:
            ref = self._actor.submit.remote(
                request_id, list(prompt_token_ids), params, opts, self._client
            )
            self._on_failure(ref.future())
            while not finished:
                item = await queue.get()
                if isinstance(item, Refusal):
                    finished = True
                    raise ValueError(item.message)
                finished = item.finished
                yield item
        finally:
            if self._streams.get(request_id) is queue:
                del self._streams[request_id]
            if not finished and self.is_healthy:  # the caller left: free the actor's blocks
                self._fire(self._actor.cancel.remote(request_id))

    async def abort(self, request_id: str) -> None:
        if request_id in self._streams and self.is_healthy:
            self._fire(self._actor.abort.remote(request_id))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._end_all("the replica is shutting down")
        if self._puller is not None:
            self._puller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._puller
        if self.shared and self._failure is None and not self._stale():
            await _leave_actor(self._actor, self._client)
            log.info("left the shared Ray replica on %s running", self.ready.node_ip)
        else:
            await _stop_actor(self._actor)

    def _stale(self) -> bool:
        return time.monotonic() - self._answered_at > STALE_S

    # -- receiving --------------------------------------------------------------------------

    async def _pull_loop(self) -> None:
        try:
            async for pulled in self._pulls():
                self._take(pulled)
                if pulled.failure is not None:
                    self._die(pulled.failure)
                    return
            self._die("its feed ended")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # RayActorError, ActorDiedError, a node gone, ...
            self._die(f"{type(e).__name__}: {_first_line(e)}")

    async def _pulls(self) -> AsyncIterator[Pulled]:
        if os.environ.get(TRANSPORT_ENV) == "feed":  # the A/B of bench/ray_overhead.py
            feed = self._actor.feed.options(num_returns="streaming")
            async for ref in feed.remote(PULL_WAIT_S, self._client):
                yield await ref
            return
        while True:
            yield await self._actor.pull.remote(PULL_WAIT_S, self._client)

    def _take(self, pulled: Pulled) -> None:
        self._answered_at = time.monotonic()
        if pulled.stats is not None:
            self._stats = pulled.stats
        for item in pulled.items:
            queue = self._streams.get(item.request_id)
            if queue is not None:
                queue.put_nowait(item)

    def _die(self, reason: str) -> None:
        if self._failure is None and not self._closed:
            log.error("Ray replica on node %s failed: %s", self.ready.node_ip, reason)
            self._failure = reason
        self._end_all(f"Ray replica failed: {reason}")

    def _end_all(self, reason: str) -> None:
        for request_id, queue in list(self._streams.items()):
            queue.put_nowait(_error(request_id, reason))

    def _on_failure(self, future: Future[None]) -> None:
        """A submit fails when its actor is gone: the replica is down from that moment (maybe
        before its pull loop hears), so that the router retries the request elsewhere."""
        loop = asyncio.get_running_loop()

        def done(f: Future[None]) -> None:
            e = None if f.cancelled() else f.exception()
            if e is not None:
                loop.call_soon_threadsafe(self._die, f"{type(e).__name__}: {_first_line(e)}")

        future.add_done_callback(done)

    def _fire(self, ref: Any) -> None:
        """A call whose answer no one waits for; its failure is the pull loop's to notice."""
        ref.future().add_done_callback(lambda f: f.cancelled() or f.exception())


async def _leave_actor(actor: Any, client: str) -> None:
    """Cancel this front end's requests in a shared actor and leave it running."""
    with contextlib.suppress(Exception):  # gone meanwhile: then nothing is left to cancel
        await asyncio.wait_for(actor.release.remote(client), 10.0)


async def _stop_actor(actor: Any) -> None:
    import ray

    with contextlib.suppress(Exception):  # dead already, or its node gone: nothing to close
        await asyncio.wait_for(actor.close.remote(), 10.0)
    # Without a connection there is no actor to kill, and ray.kill would start a cluster.
    if not ray.is_initialized():
        return
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


def _first_line(e: object) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _error(request_id: str, message: str) -> GenerationChunk:
    return GenerationChunk(request_id, "", [], FinishReason.ERROR, error=message)
