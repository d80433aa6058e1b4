"""The path every generation route shares: admit a request, run it on its engine, settle up.

`admit` (api/admit.py) makes a `Job` of a request that passed every check. `RequestRun`
iterates the engine's chunks and, in `close()` — always called, in a `finally` — aborts the
engine request if it has not finished, hands the tokens back to the gateway and records the
metrics and the ledger's record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from fastapi import Request

from headrace.api.errors import APIError
from headrace.api.job import Job
from headrace.api.outcomes import Outcome, engine_failure, raise_for
from headrace.api.request_trace import traced
from headrace.api.sse import DONE, error_event, wait_for_disconnect
from headrace.api.state import AppState
from headrace.api.usage_record import record_usage
from headrace.engine.frontend.client import GenerationChunk
from headrace.request import FinishReason

log = logging.getLogger("headrace.api")
T = TypeVar("T")


class Run(Protocol):
    """What the routes iterate: one request's chunks (`RequestRun`), or its `n` choices'."""

    job: Job

    def __aiter__(self) -> Run: ...

    async def __anext__(self) -> GenerationChunk: ...

    async def close(self) -> None: ...


class RequestRun:
    """Iterates one job's chunks from its engine; `close()` must follow, in a `finally`.
    With `settle=False` closing leaves the gateway and the metrics to the caller (`record`)."""

    def __init__(self, state: AppState, job: Job, *, settle: bool = True) -> None:
        self.state = state
        self.job = job
        self.settle = settle
        self.chunks = job.engine.generate(job.request_id, job.prompt_ids, job.params, job.options)
        self.prompt_tokens = len(job.prompt_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.replica: str | None = None
        self.last: GenerationChunk | None = None  # the engine's counts, for the ledger
        self.http_status: int | None = None  # the engine's failure as an HTTP error, if any
        self.closed = False

    def usage(self) -> dict[str, object]:
        """OpenAI's `usage` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def __aiter__(self) -> RequestRun:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self.finish_reason is not None:
            raise StopAsyncIteration
        try:
            chunk = await anext(self.chunks)
        except APIError as e:
            self.http_status = e.status
            raise
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.finish_reason = FinishReason.ERROR
            error = engine_failure(e, self.job.request_id)
            self.http_status = error.status
            raise error from e
        return self._record(chunk)

    def _record(self, chunk: GenerationChunk) -> GenerationChunk:
        job = self.job
        first = job.timer.first_token is None
        job.timer.on_tokens(len(chunk.token_ids), chunk.queue_time)
        if first and job.timer.first_token is not None:
            self.state.gateway.started(job.admission, job.timer.queue_time, job.timer.ttft)
        self.prompt_tokens = chunk.prompt_tokens or self.prompt_tokens
        self.completion_tokens = max(self.completion_tokens, chunk.completion_tokens)
        self.cached_tokens = chunk.cached_tokens or self.cached_tokens
        self.replica = chunk.replica or self.replica
        self.last = chunk
        self.finish_reason = chunk.finish_reason
        raise_for(chunk.finish_reason, chunk.error)  # ERROR: 502, OVERLOADED: 503
        return chunk

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        job = self.job
        try:
            if self.finish_reason is None:  # client gone, shutdown or an error: free the slot now
                await job.engine.abort(job.request_id)
            await self.chunks.aclose()  # type: ignore[attr-defined]
        except Exception:
            log.warning("cleaning up %s failed", job.request_id, exc_info=True)
        finally:
            if self.settle:
                used = self.prompt_tokens + self.completion_tokens
                self.state.gateway.release(job.admission, used, self.reason)
                self.record(self.prompt_tokens)
                record_usage(self.state, [self])

    @property
    def reason(self) -> str:
        return str(self.finish_reason or FinishReason.ABORT)

    def record(self, prompt_tokens: int) -> None:
        """The request's metrics (a choice after the first counts no prompt tokens)."""
        job = self.job
        job.timer.finish()
        self.state.metrics.observe_request(
            job.model, job.admission.tenant.tier, job.timer, self.reason,
            prompt_tokens, self.completion_tokens, self.cached_tokens,
            tenant=job.admission.tenant.name, weight=job.admission.tenant.weight,
        )  # fmt: skip
        if self.state.metrics.tracer is not None:
            self.state.metrics.tracer.record(traced(self, prompt_tokens))


async def unless_disconnected(state: AppState, request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but give up (cancelling it) if the client hangs up or the server stops."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    stopping = asyncio.ensure_future(state.shutdown.wait())
    try:
        await asyncio.wait([task, gone, stopping], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if stopping.done():
            raise Outcome.SHUTTING_DOWN.error()
        raise Outcome.CLIENT_GONE.error()
    finally:
        for t in (task, gone, stopping):
            if not t.done():
                t.cancel()
        await asyncio.gather(task, gone, stopping, return_exceptions=True)


async def stream_run(
    run: Run,
    first: GenerationChunk,
    event: Callable[[GenerationChunk], bytes | None],
    end: Callable[[], list[bytes]],
    prelude: Sequence[bytes] = (),
) -> AsyncGenerator[bytes, None]:
    """The SSE events of a run: `prelude`, `event(chunk)` for each chunk (None: nothing to send),
    `end()` once finished, then `[DONE]`; an error midway becomes an error event."""
    try:
        for item in prelude:
            yield item
        chunk: GenerationChunk | None = first
        while chunk is not None:
            data = event(chunk)
            if data is not None:
                yield data
            chunk = await anext(run, None)
        run.job.timer.finish()
        for item in end():
            yield item
    except APIError as e:
        yield error_event(e.message, e.type, e.code)
    finally:
        await run.close()
    yield DONE


async def start_stream(state: AppState, request: Request, run: Run) -> GenerationChunk:
    """Wait for the first chunk before sending headers, so that a refusal is still a JSON error."""
    try:
        return await unless_disconnected(state, request, anext(run))
    except BaseException:
        await run.close()
        raise


async def run_to_end(state: AppState, request: Request, run: Run) -> list[GenerationChunk]:
    """All of a run's chunks (non-streaming), aborted if the client leaves first."""

    async def collect() -> list[GenerationChunk]:
        return [chunk async for chunk in run]

    try:
        return await unless_disconnected(state, request, collect())
    finally:
        await run.close()
