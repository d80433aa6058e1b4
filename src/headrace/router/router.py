"""The router: one model's `EngineClient` over several replicas.

A request goes to the replica its policy picks among those in rotation — of the long-prompt
pool when its prompt is longer than the threshold (the other pool when its own has none
left). If that replica fails before the request streamed anything (its process died, its
server went away), the request is sent to another replica, each at most once. If it fails
after, the stream is resumed on another replica from the prompt plus the tokens already sent
(`resume.py`, at most `max_resumes` times, waiting up to `resume_wait_s` for a replica in
rotation, and never past the request's own timeout, which ends it with finish reason
`timeout`): the caller sees a pause, not an error. A replica that fails leaves the rotation at
once; the supervisor brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Protocol

from headrace.config import RouterConfig
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams, prefix_salt
from headrace.router.attempt import Attempt, end_chunk, for_caller
from headrace.router.deadlines import deadline_of, time_left_since
from headrace.router.load import sum_stats
from headrace.router.lora_changes import LoraChanges
from headrace.router.policies import make_policy
from headrace.router.prefix_index import prefix_hashes
from headrace.router.replica import Replica
from headrace.router.resume import ResumableStream
from headrace.router.supervisor import Supervisor

log = logging.getLogger("headrace.router")


class Autoscaling(Protocol):
    """What a router asks of the autoscaler that adds and removes its replicas
    (`autoscale_loop.AutoscaleLoop`, which drives the router: hence only this shape here)."""

    def start(self) -> None: ...
    async def close(self) -> None: ...
    def describe(self) -> dict[str, object]: ...


_RESUME_POLL_S = 0.05


class NoReplicaError(RuntimeError):
    """No replica of the model is in rotation (the API answers 503)."""


class Router:
    def __init__(
        self, model_name: str, replicas: Sequence[Replica], config: RouterConfig | None = None
    ) -> None:
        if not replicas:
            raise ValueError(f"model {model_name!r} has no replica")
        self.name = model_name
        self.replicas = list(replicas)
        self.config = config or RouterConfig()
        self.policy = make_policy(
            self.config.routing, margin_tokens=self.config.cache_aware_margin_tokens
        )
        self.supervisor = Supervisor(self.replicas, self.config)
        self.retries = 0  # requests sent again after their replica failed
        self.resumes = 0  # streams continued elsewhere after their replica failed mid-way
        self.tokens_delivered = 0  # output tokens sent to callers: the autoscaler's demand
        self.autoscaler: Autoscaling | None = None
        # LoRA adapters changed at run time: replicas started later replay them (deploy.py)
        self.lora_changes = LoraChanges()
        self._placed: dict[str, Replica] = {}  # request id -> the replica it is on now
        self._between: dict[str, bool] = {}  # resumed streams between replicas -> aborted
        self._closed = False

    def start(self) -> None:
        """Start watching (and autoscaling) the replicas (needs a running event loop)."""
        self.supervisor.start()
        if self.autoscaler is not None:
            self.autoscaler.start()

    def add_replica(self, replica: Replica) -> None:
        """A replica joins at run time (the autoscaler's)."""
        self.replicas.append(replica)
        self.supervisor.replicas.append(replica)

    def remove_replica(self, replica: Replica) -> None:
        """A drained replica leaves for good; its caller closes its engine."""
        self.replicas.remove(replica)
        self.supervisor.replicas.remove(replica)

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.name

    @property
    def max_model_len(self) -> int:
        return min(r.info.max_model_len for r in self.replicas)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.replicas[0].info.tokenizer

    @property
    def is_healthy(self) -> bool:
        return self.failure is None

    @property
    def failure(self) -> str | None:
        if self._closed:
            return "the router is shut down"
        return None if any(r.serving for r in self.replicas) else "no replica is in rotation"

    @property
    def pid(self) -> int | None:
        return None  # each replica has its own (describe() lists them)

    def stats(self) -> StepStats:
        """The sum over the replicas in rotation."""
        serving = [r for r in self.replicas if r.serving]
        for r in serving:
            r.observe()
        return sum_stats(r.load.reported for r in serving)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        ids = list(prompt_token_ids)
        opts = options or GenerateOptions()
        salt = prefix_salt(opts.tenant, opts.cache_salt, opts.lora)
        affinity = self.policy.uses_prefixes and len(self.replicas) > 1
        hashes = prefix_hashes(ids, salt) if affinity else []
        stream = ResumableStream(ids, params, self.config.max_resumes, self.tokenizer)
        attempts = self._attempts(request_id, ids, stream, opts, hashes)
        try:
            async with contextlib.aclosing(attempts):  # a caller who leaves aborts it at once
                async for chunk in attempts:
                    yield chunk
        finally:
            self._between.pop(request_id, None)

    async def _attempts(
        self,
        request_id: str,
        ids: list[int],
        stream: ResumableStream,
        opts: GenerateOptions,
        hashes: list[bytes],
    ) -> AsyncGenerator[GenerationChunk, None]:
        """The request's attempts, one replica after another, as one stream."""
        t0 = time.monotonic()
        deadline = deadline_of(opts, t0)
        tried: set[int] = set()
        failure: GenerationChunk | None = None
        while True:
            replica = await self._next_replica(request_id, ids, opts.lora, tried, hashes, deadline)
            if self._between.pop(request_id, False):  # aborted while it waited
                yield stream.deliver(end_chunk(request_id, FinishReason.ABORT))
                return
            if replica is None:
                yield stream.deliver(self._give_up(request_id, failure, deadline))
                return
            tried.add(id(replica))
            attempt = Attempt(replica, request_id, self._placed)
            prompt_ids, attempt_params = stream.request()
            chunks = attempt.run(prompt_ids, attempt_params, time_left_since(opts, t0))
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    self.tokens_delivered += len(chunk.token_ids)
                    yield stream.deliver(chunk)
                    if stream.stopped:
                        return  # a stop string across a resume's seam: closing aborts it
            if attempt.failure is None:
                return
            failure = attempt.failure
            end = self._after_failure(request_id, attempt, stream, tried)
            if end is not None:
                yield stream.deliver(end)
                return

    def _give_up(
        self, request_id: str, failure: GenerationChunk | None, deadline: float | None
    ) -> GenerationChunk:
        """No replica for the next attempt: how the stream ends (NoReplicaError before any)."""
        if failure is None:
            raise NoReplicaError(f"no replica of model {self.name!r} is in rotation")
        if deadline is not None and time.monotonic() >= deadline:  # as the engine ends it
            return end_chunk(request_id, FinishReason.TIMEOUT)
        return for_caller(request_id, failure)

    def _after_failure(
        self, request_id: str, attempt: Attempt, stream: ResumableStream, tried: set[int]
    ) -> GenerationChunk | None:
        """How the stream ends after a failed attempt, or None to go on: retried elsewhere
        before any token, else resumed (where every replica may serve again)."""
        replica, failure = attempt.replica, attempt.failure
        assert failure is not None
        if not (attempt.streamed or stream.resumes):
            self.retries += 1
            log.warning("retrying %s elsewhere: replica %s failed", request_id, replica.name)
            return None
        why_not = stream.why_not_resumable()
        if why_not is not None:
            log.warning("not resuming %s after %s failed: %s", request_id, replica.name, why_not)
            return for_caller(request_id, failure)
        stream.resume()
        self.resumes += 1
        log.warning(
            "resuming %s elsewhere after %d tokens: replica %s failed (%s)",
            request_id, len(stream.sent_ids), replica.name, failure.error,
        )  # fmt: skip
        self._between[request_id] = False
        tried.clear()  # out of rotation: back in it after a restart, it may serve
        return None

    async def _next_replica(
        self,
        request_id: str,
        ids: list[int],
        adapter: str | None,
        tried: set[int],
        hashes: list[bytes],
        request_deadline: float | None,
    ) -> Replica | None:
        """The replica for the next attempt; a stream to resume waits for one a while (until
        it is aborted, or the request's own deadline)."""
        replica = self._choose(len(ids), tried, hashes, adapter)
        deadline = time.monotonic() + self.config.resume_wait_s
        if request_deadline is not None:
            deadline = min(deadline, request_deadline)

        def waits() -> bool:
            resuming = self._between.get(request_id) is False  # False: not aborted
            return resuming and not self._closed and time.monotonic() < deadline

        while replica is None and waits():
            await asyncio.sleep(_RESUME_POLL_S)
            replica = self._choose(len(ids), tried, hashes, adapter)
        return replica

    async def abort(self, request_id: str) -> None:
        if request_id in self._between:
            self._between[request_id] = True
        replica = self._placed.get(request_id)
        if replica is not None:
            await replica.engine.abort(request_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.autoscaler is not None:
            await self.autoscaler.close()
        await self.supervisor.close()
        for replica in self.replicas:
            try:
                await replica.engine.close()
            except Exception:
                log.warning("closing replica %s failed", replica.name, exc_info=True)

    # -- routing ----------------------------------------------------------------------------

    def _choose(
        self, prompt_tokens: int, tried: set[int], hashes: list[bytes], adapter: str | None = None
    ) -> Replica | None:
        if self._closed:
            return None
        threshold = self.config.long_prompt_threshold
        pool = "long" if threshold is not None and prompt_tokens > threshold else "main"
        open_ = [(i, r) for i, r in enumerate(self.replicas) if r.serving and id(r) not in tried]
        own = [(i, r) for i, r in open_ if r.pool == pool]
        pick_from = own or open_  # a pool with no replica left borrows the other's
        if not pick_from:
            return None
        choice = self.policy.choose(
            [r.candidate(i, r.prefixes.match(hashes), adapter) for i, r in pick_from]
        )
        replica = self.replicas[choice.index]
        replica.prefixes.record(hashes)
        return replica

    def describe(self) -> dict[str, object]:
        """The replicas' states and loads, for /health and /v1/stats."""
        return {
            "policy": self.policy.name,
            "retries": self.retries,
            "resumes": self.resumes,
            **({"autoscaler": self.autoscaler.describe()} if self.autoscaler else {}),
            "replicas": [r.describe() for r in self.replicas],
        }
