"""Resuming a stream whose replica died mid-way: on another replica, from the prompt plus the
tokens the caller already has.

The continuation is an ordinary request to any `EngineClient`: its prompt is the original
prompt followed by the tokens sent so far, `max_tokens` and `min_tokens` are reduced by their
number and, for a seeded request, `seed_offset` moves on by it, so that its draws are those
the original would have made next (greedy requests continue exactly). What the caller sees is
one stream: usage counts the original prompt and every token it received, text that the dead
replica had decoded but held back (a possible stop string, an unfinished word) is sent at the
resume, and stop strings are also matched across the seam.

The tokens sent so far are marked as the request's own output (`prior_output_tokens`), so that
bad_words and the presence and frequency penalties of the continuation count them: a bad word
begun before the failover is not completed after it.

Not resumable (they end with the error, as before): requests with a grammar, whose state lives
in the dead engine and cannot be rebuilt from a prompt.
"""

from __future__ import annotations

import dataclasses

from headrace.engine.frontend.client import GenerationChunk
from headrace.engine.frontend.detokenizer import IncrementalDetokenizer
from headrace.engine.frontend.stop_strings import StopStringMatcher
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.request import FinishReason, SamplingParams

_REPLACEMENT = "\ufffd"


class ResumableStream:
    """One routed request's progress, as the caller has received it."""

    def __init__(
        self, prompt_ids: list[int], params: SamplingParams, max_resumes: int, tokenizer: Tokenizer
    ) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.max_resumes = max_resumes
        self.tokenizer = tokenizer
        self.sent_ids: list[int] = []
        self._texts: list[str] = []  # the text the caller received, piece by piece
        self.resumes = 0
        self.stopped = False  # a stop string across the seam ended it here
        self._pending = ""  # held-back text of the dead attempt, sent with the next chunk
        self._stops: StopStringMatcher | None = None
        self._first: GenerationChunk | None = None  # queue time and cached tokens come from it

    # -- what to send -----------------------------------------------------------------------

    def request(self) -> tuple[list[int], SamplingParams]:
        """The prompt and parameters of the next attempt."""
        if not self.sent_ids:
            return self.prompt_ids, self.params
        n = len(self.sent_ids)
        p = self.params
        params = dataclasses.replace(
            p,
            max_tokens=p.max_tokens - n,
            min_tokens=max(p.min_tokens - n, 0),
            seed_offset=p.seed_offset + n if p.seed is not None else p.seed_offset,
            prior_output_tokens=p.prior_output_tokens + n,
        )
        return self.prompt_ids + self.sent_ids, params

    def why_not_resumable(self) -> str | None:
        """None when a failed attempt can be continued elsewhere."""
        p = self.params
        if self.resumes >= self.max_resumes:
            return f"resumed {self.resumes} time(s) already (--max-resumes {self.max_resumes})"
        if p.grammar is not None:
            return "a grammar's state cannot be rebuilt from a prompt"
        if len(self.sent_ids) >= p.max_tokens:
            return "it had all its tokens"
        return None

    def resume(self) -> None:
        """The current attempt failed after streaming: the next one continues it."""
        self.resumes += 1
        held = self._held_text()
        if self.params.stop:  # the new replica's matcher sees only its own text
            self._stops = StopStringMatcher(self.params.stop)
            held = self._stops.feed(held)
        self._pending = held  # a resume that failed before its first chunk: afresh

    # -- what the caller gets ---------------------------------------------------------------

    def deliver(self, chunk: GenerationChunk) -> GenerationChunk:
        """`chunk` of the current attempt as the caller sees it, in the whole stream."""
        self.sent_ids.extend(chunk.token_ids)
        if self._first is None:
            self._first = chunk
        if not self.resumes:
            self._texts.append(chunk.text)
            return chunk
        text, reason = chunk.text, chunk.finish_reason
        if self._stops is not None:
            text = self._stops.feed(text)
            if self._stops.stopped:
                reason, self.stopped = FinishReason.STOP, True
            elif reason is not None:
                text += self._stops.flush()
        text, self._pending = self._pending + text, ""
        self._texts.append(text)
        return dataclasses.replace(
            chunk,
            text=text,
            finish_reason=reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.sent_ids),
            queue_time=self._first.queue_time,
            cached_tokens=self._first.cached_tokens,
            resumed=True,
        )

    def _held_text(self) -> str:
        """Text of the tokens sent that the caller has not received: what the dead replica's
        detokenizer or stop-string matcher still held back."""
        detok = IncrementalDetokenizer(self.tokenizer, self.prompt_ids)  # as the replica's
        decoded = detok.add(self.sent_ids) + detok.flush()
        received = "".join(self._texts)
        if not decoded.startswith(received):
            return ""  # decoded differently in pieces (rare): send nothing rather than twice
        return decoded[len(received) :].rstrip(_REPLACEMENT)
