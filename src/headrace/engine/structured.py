"""Structured outputs in the runner: each constrained request's grammar matcher (llguidance)
masks its row of the logits before sampling, then consumes the token sampled.

A request carries its grammar as a string (`SamplingParams.grammar`, made and validated by the
front end). Its matcher is built when the request is first scheduled, in a worker thread
(llguidance drops the GIL while it builds), so a large schema builds while the model computes
the prompt rather than on the step. Matchers live here, keyed by request id, across steps and
preemptions, until the scheduler reports the request finished.

A step that fails is retried in halves (`step_retry`), so the same step may be executed
twice: a matcher that consumed more tokens than the request has is rolled back first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.kernels.token_mask import mask_tokens

if TYPE_CHECKING:
    import llguidance


@dataclass
class _State:
    matcher: llguidance.LLMatcher
    consumed: int = 0  # output tokens the matcher has seen
    after_stop: int = 0  # tokens after the grammar completed (ignore_eos): the matcher saw none

    @property
    def seen(self) -> int:
        return self.consumed + self.after_stop


class GrammarMasks:
    def __init__(
        self, tokenizer_json: Callable[[], str], vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        """`tokenizer_json`: the Hugging Face tokenizer's JSON, asked for at the first grammar
        (0.3 s for Gemma's vocabulary: not on the start path)."""
        self.vocab_size = vocab_size
        self._tokenizer_json = tokenizer_json
        self._eos = list(eos_token_ids)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._tokenizer: llguidance.LLTokenizer | None = None  # built by the pool's thread
        self._states: dict[str, Future[_State]] = {}

    def prepare(self, scheduled: Sequence[ScheduledRequest]) -> None:
        """Start building the matchers of constrained requests seen for the first time."""
        for s in scheduled:
            if s.params.grammar is not None and s.request_id not in self._states:
                self._states[s.request_id] = self._pool.submit(self._build, s.params.grammar)

    def apply(self, logits: torch.Tensor, sampled: Sequence[ScheduledRequest]) -> None:
        """Mask, in place, the rows of constrained requests: logits [S, V], one per request."""
        rows = [i for i, s in enumerate(sampled) if s.params.grammar is not None]
        if not rows:
            return
        words = (self.vocab_size + 31) // 32
        bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)  # [R, V/32]
        stopped = []
        for k, i in enumerate(rows):
            state = self._sync(sampled[i])
            if state.matcher.is_stopped():  # complete: only the end of the sequence is left
                stopped.append(k)
            else:  # (llguidance.torch would import torch.compile's machinery for this)
                state.matcher.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), words * 4)
        for k in stopped:
            bitmask[k] = 0
            for eos in self._eos:
                bitmask[k, eos // 32] |= _bit(eos % 32)
        mask_tokens(logits, rows, bitmask)

    def advance(self, sampled: Sequence[ScheduledRequest], tokens: Sequence[int]) -> None:
        """Feed each constrained request's matcher the token it was given."""
        for s, token in zip(sampled, tokens, strict=True):
            if s.params.grammar is None:
                continue
            state = self._sync(s)
            if state.matcher.is_stopped():
                state.after_stop += 1
            elif state.matcher.consume_token(token):
                state.consumed += 1
            else:
                error = state.matcher.get_error()
                raise ValueError(
                    f"request {s.request_id}: token {token} breaks its grammar: {error}"
                )

    def drop(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self._states.pop(rid, None)

    @property
    def num_matchers(self) -> int:
        return len(self._states)

    def _sync(self, s: ScheduledRequest) -> _State:
        """The request's matcher, rolled back to its output so far (after a retried step)."""
        future = self._states.get(s.request_id)
        if future is None:  # its first chunk was scheduled before this runner existed
            future = self._states[s.request_id] = self._pool.submit(self._build, s.params.grammar)
        state = future.result()
        if state.matcher.is_error():
            raise ValueError(f"request {s.request_id}: grammar error: {state.matcher.get_error()}")
        excess = state.seen - s.num_output_tokens
        if excess < 0:
            raise ValueError(f"request {s.request_id}: its grammar matcher lost track")
        undo = max(0, excess - state.after_stop)  # the matcher's own tokens to take back
        state.after_stop -= excess - undo
        if undo:
            state.matcher.rollback(undo)
            state.consumed -= undo
        return state

    def _build(self, grammar: str | None) -> _State:
        import llguidance

        assert grammar is not None
        if self._tokenizer is None:  # the first constrained request pays this, once (~1-3 s)
            self._tokenizer = llguidance.LLTokenizer(
                self._tokenizer_json(), n_vocab=self.vocab_size, eos_token=self._eos
            )
        return _State(llguidance.LLMatcher(self._tokenizer, grammar, log_level=0))


def _bit(i: int) -> int:
    """Bit i of an int32 word as a Python int (bit 31 is the sign bit)."""
    return -(1 << 31) if i == 31 else 1 << i
