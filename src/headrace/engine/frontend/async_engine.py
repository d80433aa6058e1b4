"""The asyncio front end of one model replica: the `EngineClient` the HTTP layer and the
router use.

The step loop runs elsewhere — a core process (default) or a thread — so model compute never
blocks the event loop. The front end owns the text: it loads the tokenizer itself (while the
core loads the model), checks that a request fits, sends token ids, and one receiver routes
each step's outputs to per-request queues, detokenizing and cutting stop strings on the way.
Closing a request's iterator (client gone) aborts it in the core, which frees its blocks
within one step; if the core dies, every open request ends with an error chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.core_connection import CoreConnection
from headrace.engine.core.core_link import CoreBusyError
from headrace.engine.core.core_loop import CoreSpec, QueueFactory, RunnerFactory
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.frontend.lora_commands import LoraCommands
from headrace.engine.frontend.open_streams import OpenStreams
from headrace.engine.frontend.text_stream import RequestTextStream
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.limits import check_fits
from headrace.engine.messages import (
    AbortRequests,
    CoreFailed,
    CoreOutputs,
    CoreReady,
    FromCore,
    LoraDone,
    RequestOutput,
    StepStats,
)
from headrace.loader.cache import resolve_model
from headrace.loader.errors import ModelLoadError
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import FinishReason, SamplingParams

log = logging.getLogger(__name__)


class AsyncEngine:
    """Use `await AsyncEngine.start(...)`; it returns once the model is loaded."""

    def __init__(self, conn: CoreConnection) -> None:
        self._conn = conn
        self._streams = OpenStreams()
        self._stats = StepStats()
        self._dead: str | None = None  # why the core is gone
        self._closed = False
        self._info: CoreReady | None = None
        self._tokenizer: Tokenizer | None = None
        self._ready: asyncio.Future[CoreReady] = asyncio.get_running_loop().create_future()
        self._loras = LoraCommands(conn.send)

    @classmethod
    async def start(
        cls,
        model_config: ModelConfig | None = None,
        cache_config: CacheConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
        *,
        served_model_name: str | None = None,
        in_process: bool = False,
        queue_factory: QueueFactory | None = None,
        runner_factory: RunnerFactory | None = None,
        tokenizer: Tokenizer | None = None,
        startup_timeout_s: float | None = None,
    ) -> AsyncEngine:
        """Start a replica's core (a process, or a thread with `in_process`) and wait for it.

        `queue_factory` builds the core's WaitingQueue (e.g. `FairQueue`); `runner_factory`
        replaces the model runner (tests). Both must be picklable for a process core. Without
        a `tokenizer`, the model directory's is loaded here while the core loads the model.
        """
        model_config = model_config or ModelConfig()
        cache, sched = cache_config or CacheConfig(), scheduler_config or SchedulerConfig()
        spec = CoreSpec(model_config, cache, sched, queue_factory, runner_factory)
        conn: CoreConnection
        if in_process:
            from headrace.engine.core.core_thread import ThreadCore

            conn = ThreadCore(spec, served_model_name)
        else:
            from headrace.engine.core.core_proc import ProcessCore

            conn = ProcessCore(spec, served_model_name)
        return await cls.open(conn, tokenizer, startup_timeout_s)

    @classmethod
    async def open(
        cls,
        conn: CoreConnection,
        tokenizer: Tokenizer | None = None,
        startup_timeout_s: float | None = None,
    ) -> AsyncEngine:
        """Start the core of a connection made here (e.g. a `ProcessCore` with its own link
        limits) and wait for it; `start` does the rest."""
        engine = cls(conn)
        model_config = conn.spec.model_config
        try:
            await asyncio.wait_for(engine._start(model_config, tokenizer), startup_timeout_s)
        except BaseException:
            await conn.close()
            raise
        return engine

    async def _start(self, model_config: ModelConfig, tokenizer: Tokenizer | None) -> None:
        loading: asyncio.Task[Tokenizer] | None = None
        if tokenizer is None:
            # Resolved before the core starts, so that a GGUF is converted once, here.
            try:
                model_dir, _ = await asyncio.to_thread(resolve_model, model_config.model)
            except ModelLoadError as e:  # as the core reports it: start fails with the reason
                raise RuntimeError(f"the model could not be loaded: {e}") from e
            loading = asyncio.create_task(_load_tokenizer(model_dir))
        self._conn.start(self._on_message, self._on_death)
        try:
            self._info = await asyncio.shield(self._ready)
            self._tokenizer = tokenizer if loading is None else await loading
        finally:
            if loading is not None:
                loading.cancel()

    # -- EngineClient ---------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._require_info().model_name

    @property
    def max_model_len(self) -> int:
        return self._require_info().max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        self._require_info()
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def num_kv_blocks(self) -> int:
        return self._require_info().num_kv_blocks

    @property
    def block_size(self) -> int:
        return self._require_info().block_size

    @property
    def is_healthy(self) -> bool:
        return self.failure is None

    @property
    def failure(self) -> str | None:
        if self._closed:
            return "the engine is shut down"
        if self._dead is None and not self._conn.is_alive:
            return "the engine core is gone"
        return self._dead

    @property
    def pid(self) -> int | None:
        """The core process's id (None for a core thread): the router kills a hung core."""
        return self._conn.pid

    def describe(self) -> dict[str, object]:
        """The core's runner: device, dtype, KV blocks."""
        return dict(self._require_info().runner)

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
        """Stream one request's chunks; the last has a `finish_reason`.

        Raises ValueError before yielding if the request can never fit, its id is in use or
        an option is out of range (e.g. a weight of 0).
        """
        info = self._require_info()
        ids = list(prompt_token_ids)
        check_fits(len(ids), params.max_tokens, info.max_model_len, self._capacity_tokens)
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = self._streams.new(RequestTextStream(request_id, self.tokenizer, ids, params))
        opts = options or GenerateOptions()
        core_request = opts.core_request(stream.core_id, ids, params, self.tokenizer.eos_token_ids)
        core_request.validate()  # a bad option is the caller's error here, not the core's
        if self.failure is not None:
            yield stream.text.fail(self.failure)
            return
        try:
            self._conn.send(core_request)
        except CoreBusyError as e:  # refused now rather than queued without bound
            yield stream.text.fail(str(e), FinishReason.OVERLOADED)
            return
        self._streams.open(stream)
        try:
            while True:
                chunk = await stream.chunks.get()
                yield chunk
                if chunk.finished:
                    return
        finally:
            if not stream.text.finished:  # the caller left early: free the core's blocks
                self._conn.send(AbortRequests([stream.core_id]))
            self._streams.forget(stream)

    async def lora_command(self, name: str, path: str | None) -> None:
        """Load the adapter in directory `path` as `name` in the core, or unload `name`
        (`path` None); ValueError with the core's reason when refused (nothing changed)."""
        if self.failure is not None:
            raise RuntimeError(self.failure)
        await self._loras.run(name, path)

    async def abort(self, request_id: str) -> None:
        """End a request; its iterator (if still read) gets a final `abort` chunk."""
        stream = self._streams.get(request_id)
        if stream is not None:
            self._conn.send(AbortRequests([stream.core_id]))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._streams.end_all("the engine is shutting down")
        await self._conn.close()

    # -- receiving --------------------------------------------------------------------------

    def _on_message(self, msg: FromCore) -> None:
        if isinstance(msg, CoreOutputs):
            self._stats = msg.stats
            for out in msg.outputs:
                self._route(out)
        elif isinstance(msg, LoraDone):
            self._loras.answer(msg)
        elif isinstance(msg, CoreReady):
            if not self._ready.done():
                self._ready.set_result(msg)
        elif isinstance(msg, CoreFailed):
            self._dead = "the model failed to load"
            if not self._ready.done():
                self._ready.set_exception(RuntimeError(f"engine core failed:\n{msg.error}"))

    def _route(self, out: RequestOutput) -> None:
        stop = self._streams.route(out)
        if stop is not None:
            self._conn.send(AbortRequests([stop]))

    def _on_death(self, reason: str) -> None:
        log.error("%s", reason)
        self._dead = reason
        if not self._ready.done():
            self._ready.set_exception(RuntimeError(reason))
        self._loras.fail_all(reason)
        self._streams.end_all(reason)

    @property
    def _capacity_tokens(self) -> int:
        info = self._require_info()
        return info.num_kv_blocks * info.block_size

    def _require_info(self) -> CoreReady:
        if self._info is None:
            raise RuntimeError("the engine has not started; use `await AsyncEngine.start(...)`")
        return self._info


async def _load_tokenizer(model_dir: Path) -> Tokenizer:
    return await asyncio.to_thread(load_tokenizer, model_dir)
