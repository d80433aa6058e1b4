"""`n` choices of one request (OpenAI's `n`), streamed as they come, each chunk with its `index`.

Choice 0 runs alone until its first token: by then the model has computed its prompt and the
prefix cache holds the prompt's full KV blocks, so choices 1..n-1, started then, reuse them and
compute only the prompt's last, partial block — the prompt is computed once, whatever `n` (with
`--no-enable-prefix-caching`, once per choice). Choice i samples with seed `seed + i` (with a
seed), so each equals a single request with that seed. The choices are one request for the
gateway (admitted for `n * max_tokens`, settled once) and `n` requests for the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses

from headrace.api.job import Job
from headrace.api.serving import RequestRun
from headrace.api.state import AppState
from headrace.api.usage_record import record_usage
from headrace.engine.frontend.client import GenerationChunk
from headrace.metrics.timing import RequestTimer

_Item = tuple[int, GenerationChunk | BaseException | None]  # None: that choice has ended


class Choices:
    """A `Run` over the choices; `close()` must follow, in a `finally`."""

    def __init__(self, state: AppState, job: Job, n: int) -> None:
        self.state = state
        self.job = job
        self.n = n
        self.runs = [RequestRun(state, job, settle=n == 1)]
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._live = 0
        self.closed = False

    def usage(self) -> dict[str, object]:
        """OpenAI's `usage`: the prompt once, every choice's completion tokens."""
        usage = self.runs[0].usage()
        completion = sum(r.completion_tokens for r in self.runs)
        prompt = self.runs[0].prompt_tokens
        return {**usage, "completion_tokens": completion, "total_tokens": prompt + completion}

    def reason(self, index: int) -> str:
        return self.runs[index].reason

    def __aiter__(self) -> Choices:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self.n == 1:
            return await anext(self.runs[0])
        if not self._tasks:
            self._start(0)
        while self._live:
            index, item = await self._queue.get()
            if item is None:
                self._live -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            if index == 0 and len(self.runs) == 1:
                self._start_siblings()
            return dataclasses.replace(item, index=index)
        raise StopAsyncIteration

    def _start_siblings(self) -> None:
        job, seed = self.job, self.job.params.seed
        for i in range(1, self.n):
            params = dataclasses.replace(job.params, seed=None if seed is None else seed + i)
            timer = RequestTimer(start=job.timer.start)
            sibling = dataclasses.replace(
                job, request_id=f"{job.request_id}-{i}", params=params, timer=timer
            )
            self.runs.append(RequestRun(self.state, sibling, settle=False))
            self._start(i)

    def _start(self, index: int) -> None:
        self._live += 1
        self._tasks.append(asyncio.create_task(self._pump(index)))

    async def _pump(self, index: int) -> None:
        try:
            async for chunk in self.runs[index]:
                await self._queue.put((index, chunk))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # an APIError (502, 503, ...) ends the whole request
            await self._queue.put((index, e))
        finally:
            self._queue.put_nowait((index, None))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for run in self.runs:
                await run.close()
        finally:  # a cancellation here must not skip the gateway's refund or the ledger
            if self.n > 1:
                self._settle()

    def _settle(self) -> None:
        used = self.runs[0].prompt_tokens + sum(r.completion_tokens for r in self.runs)
        self.state.gateway.release(self.job.admission, used, self.runs[0].reason)
        for i, run in enumerate(self.runs):
            run.record(run.prompt_tokens if i == 0 else 0)
        record_usage(self.state, self.runs, self.n)
