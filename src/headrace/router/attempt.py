"""One attempt of a routed request: the request on one replica.

A failure of the replica itself (not of the request) ends the attempt quietly with `failure`
set, so that the router tries another replica, or resumes there if a chunk already reached
the caller (`streamed`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.request import FinishReason, SamplingParams
from headrace.router.replica import Replica

log = logging.getLogger("headrace.router")
REPLICA_FAILED = "the replica serving this request failed; retry later"


class Attempt:
    def __init__(self, replica: Replica, request_id: str, placed: dict[str, Replica]) -> None:
        self.replica = replica
        self.request_id = request_id
        self.placed = placed  # the router's request -> replica map (aborts go there)
        self.streamed = False  # a chunk reached the caller: resume, not retry, from here on
        self.failure: GenerationChunk | None = None  # the replica failed: retry or resume

    async def run(
        self, ids: list[int], params: SamplingParams, options: GenerateOptions
    ) -> AsyncGenerator[GenerationChunk, None]:
        replica, request_id = self.replica, self.request_id
        chunks = replica.engine.generate(request_id, ids, params, options)
        replica.dispatched(request_id, len(ids) + params.max_tokens)
        self.placed[request_id] = replica
        try:
            async for chunk in chunks:
                if not self.streamed:
                    if _replica_failed(replica, chunk):
                        self.failure = chunk
                        return
                    replica.first_output(request_id)
                    self.streamed = True
                    chunk = dataclasses.replace(chunk, replica=replica.name)
                elif chunk.finish_reason is FinishReason.ERROR and not replica.engine.is_healthy:
                    # Out of rotation now, not at the supervisor's next look; resume elsewhere.
                    replica.mark_down(chunk.error or "it failed mid-stream")
                    self.failure = chunk
                    return
                yield chunk
        except ValueError:
            raise  # refused before it started: it can never fit
        except Exception as e:
            replica.mark_down(f"{type(e).__name__}: {e}")
            message = f"replica {replica.name} failed: {e}"
            self.failure = GenerationChunk(request_id, "", [], FinishReason.ERROR, error=message)
        finally:
            await _close(chunks)
            replica.finished(request_id)
            if self.placed.get(request_id) is replica:
                del self.placed[request_id]


def _replica_failed(replica: Replica, chunk: GenerationChunk) -> bool:
    """An error chunk because the replica itself failed (not the request): retry."""
    if chunk.finish_reason is not FinishReason.ERROR or replica.serving:
        return False
    replica.mark_down(chunk.error or "it failed")
    return True


async def _close(chunks: AsyncIterator[GenerationChunk]) -> None:
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()


def end_chunk(request_id: str, reason: FinishReason) -> GenerationChunk:
    return GenerationChunk(request_id, "", [], reason)


def for_caller(request_id: str, failure: GenerationChunk) -> GenerationChunk:
    """A replica's failure as the caller (a tenant) sees it: that it failed. Why, and where (a
    remote replica's URL, a Ray node's address), is for the log and /health's details only."""
    log.warning("request %s failed: %s", request_id, failure.error)
    return dataclasses.replace(failure, error=REPLICA_FAILED)
