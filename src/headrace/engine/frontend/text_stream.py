"""One request's output stream in the front end: token outputs in, text chunks out.

Detokenizes incrementally and applies stop strings; on a stop-string hit the chunk finishes
with `stop` and the caller aborts the request in the core (which may still send a token or
two, ignored here).
"""

from __future__ import annotations

from collections.abc import Sequence

from headrace.engine.frontend.client import GenerationChunk
from headrace.engine.frontend.detokenizer import IncrementalDetokenizer, TokenDecoder
from headrace.engine.frontend.stop_strings import StopStringMatcher
from headrace.engine.messages import RequestOutput
from headrace.request import FinishReason, SamplingParams


class RequestTextStream:
    def __init__(
        self,
        request_id: str,
        tokenizer: TokenDecoder,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = len(prompt_token_ids)
        self.detok = IncrementalDetokenizer(tokenizer, prompt_token_ids)
        self.stops = StopStringMatcher(params.stop)
        self.finished = False
        self.num_output_tokens = 0
        self.queue_time: float | None = None
        self.cached_tokens = 0
        self.counts = (0, 0, 0)  # recomputed, draft, accepted tokens (the engine's, so far)

    def process(self, out: RequestOutput) -> GenerationChunk | None:
        """The chunk for one core output; None once the stream has finished."""
        if self.finished:
            return None
        self.num_output_tokens += len(out.new_token_ids)
        self.counts = (out.num_recomputed_tokens, out.num_draft_tokens, out.num_accepted_tokens)
        if out.queue_time is not None:
            self.queue_time = out.queue_time
            self.cached_tokens = out.num_cached_tokens
        text = self.detok.add(out.new_token_ids)
        if out.finished:
            text += self.detok.flush()
        text = self.stops.feed(text)
        reason = out.finish_reason
        if self.stops.stopped:
            reason = FinishReason.STOP
        elif reason is not None:
            text += self.stops.flush()
        self.finished = reason is not None
        return GenerationChunk(
            request_id=self.request_id,
            text=text,
            token_ids=list(out.new_token_ids),
            finish_reason=reason,
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_output_tokens,
            logprobs=list(out.logprobs),
            error=out.error,
            queue_time=self.queue_time,
            cached_tokens=self.cached_tokens,
            recomputed_tokens=self.counts[0],
            draft_tokens=self.counts[1],
            accepted_tokens=self.counts[2],
        )

    def fail(self, error: str, reason: FinishReason = FinishReason.ERROR) -> GenerationChunk:
        """End the stream with an error (the core died or refused the request; `OVERLOADED`:
        the core could not take it now)."""
        self.finished = True
        return GenerationChunk(
            request_id=self.request_id,
            text="",
            token_ids=[],
            finish_reason=reason,
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_output_tokens,
            error=error,
            queue_time=self.queue_time,
            cached_tokens=self.cached_tokens,
            recomputed_tokens=self.counts[0],
            draft_tokens=self.counts[1],
            accepted_tokens=self.counts[2],
        )
