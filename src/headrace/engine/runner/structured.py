"""Structured outputs in the runner: each constrained request's grammar matcher (llguidance)
masks its row of the logits before sampling, then consumes the token sampled.

A request carries its grammar as a string (`SamplingParams.grammar`, made and validated by the
front end). Its matcher is built when the request is first scheduled, in a worker thread
(llguidance drops the GIL while it builds), so a large schema builds while the model computes
the prompt rather than on the step. Matchers live here, keyed by request id, across steps and
preemptions, until the scheduler reports the request finished.

llguidance's token table (its view of the vocabulary) is built once, by `start`, which the
runner calls while it starts: for Gemma's 262k tokens it takes about 2 s and holds the GIL the
whole time, so built at the first constrained request it would stall every stream's step.

A request its grammar leaves nowhere to go (every token the grammar allows is banned, e.g. by
min_tokens) ends alone, reported in `GrammarEnds`: `stop` when its grammar is complete, else an
error. Nothing here raises for one request: a step that fails is retried in halves
(`step_retry`), which every request in the batch would pay. Retries still happen for other
causes, so the same step may be executed twice: a matcher that consumed more tokens than the
request has is rolled back first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.logits_processors import bad_word_bans
from headrace.kernels.token_mask import mask_tokens

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger(__name__)


@dataclass
class _State:
    matcher: llguidance.LLMatcher
    consumed: int = 0  # output tokens the matcher has seen
    after_stop: int = 0  # tokens after the grammar completed (ignore_eos): the matcher saw none

    @property
    def seen(self) -> int:
        return self.consumed + self.after_stop


@dataclass
class GrammarEnds:
    """The constrained requests of a step that end here, without a token."""

    stopped: list[str] = field(default_factory=list)  # grammar complete, nothing more allowed
    errors: dict[str, str] = field(default_factory=dict)  # request id -> why it cannot go on

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.errors or request_id in self.stopped


class GrammarMasks:
    def __init__(
        self, tokenizer_json: Callable[[], str], vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        """`tokenizer_json`: the Hugging Face tokenizer's JSON, read by `start` (or by the
        first grammar, if `start` was not called)."""
        self.vocab_size = vocab_size
        self._tokenizer_json = tokenizer_json
        self._eos = list(eos_token_ids)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._table: Future[llguidance.LLTokenizer] | None = None
        self.table_build_s: float | None = None  # how long the token table took to build
        self._states: dict[str, Future[_State]] = {}

    def start(self) -> None:
        """Begin building llguidance's token table, on the pool's thread (`wait_started`)."""
        if self._table is None:
            self._table = self._pool.submit(self._build_table)

    def wait_started(self) -> float:
        """Wait for the table `start` began; the seconds waited. A failure is logged, and each
        constrained request then ends with it as its error."""
        assert self._table is not None
        began = time.perf_counter()
        error = self._table.exception()
        if error is not None:
            log.warning("structured outputs unavailable: %s", error)
        return time.perf_counter() - began

    def prepare(self, scheduled: Sequence[ScheduledRequest]) -> None:
        """Start building the matchers of constrained requests seen for the first time."""
        for s in scheduled:
            if s.params.grammar is not None and s.request_id not in self._states:
                self._states[s.request_id] = self._pool.submit(self._build, s.params.grammar)

    def apply(self, logits: torch.Tensor, sampled: Sequence[ScheduledRequest]) -> GrammarEnds:
        """Mask, in place, the rows of constrained requests: logits [S, V], one per request.
        The rows of those that end here are left unmasked (their tokens are not used)."""
        ends = GrammarEnds()
        rows = [i for i, s in enumerate(sampled) if s.params.grammar is not None]
        if not rows:
            return ends
        words = (self.vocab_size + 31) // 32
        bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)  # [R, V/32]
        kept = []
        for k, i in enumerate(rows):
            s = sampled[i]
            try:
                state = self._sync(s)
            except Exception as e:
                ends.errors[s.request_id] = str(e)
                continue
            if state.matcher.is_stopped():  # complete: only the end of the sequence is left
                bitmask[k] = 0
                for eos in self._eos:
                    bitmask[k, eos // 32] |= _bit(eos % 32)
            else:  # (llguidance.torch would import torch.compile's machinery for this)
                state.matcher.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), words * 4)
            if _allows_any(bitmask[k], _banned(s)):
                kept.append(k)
            elif state.matcher.is_stopped() or state.matcher.is_accepting():
                ends.stopped.append(s.request_id)
            else:
                ends.errors[s.request_id] = _DEAD_END
        if kept:
            mask_tokens(logits, [rows[k] for k in kept], bitmask[kept])
        return ends

    def advance(
        self, sampled: Sequence[ScheduledRequest], tokens: Sequence[int], ends: GrammarEnds
    ) -> None:
        """Feed each constrained request's matcher the token it was given; one its grammar
        refuses joins `ends.errors`."""
        for s, token in zip(sampled, tokens, strict=True):
            if s.params.grammar is None or s.request_id in ends:
                continue
            state = self._sync(s)  # as `apply` left it (it raised there, or not at all)
            if state.matcher.is_stopped():
                state.after_stop += 1
            elif state.matcher.consume_token(token):
                state.consumed += 1
            else:
                # The parser's state is for the log; the caller gets the fact.
                log.warning("request %s: token %d breaks its grammar: %s", s.request_id, token,
                            state.matcher.get_error())  # fmt: skip
                ends.errors[s.request_id] = f"token {token} does not fit the request's grammar"

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
            raise ValueError(f"grammar error: {state.matcher.get_error()}")
        excess = state.seen - s.num_output_tokens
        if excess < 0:
            raise ValueError("its grammar matcher lost track")
        undo = max(0, excess - state.after_stop)  # the matcher's own tokens to take back
        state.after_stop -= excess - undo
        if undo:
            state.matcher.rollback(undo)
            state.consumed -= undo
        return state

    def _build_table(self) -> llguidance.LLTokenizer:
        import llguidance

        began = time.perf_counter()
        table = llguidance.LLTokenizer(
            self._tokenizer_json(), n_vocab=self.vocab_size, eos_token=self._eos
        )
        self.table_build_s = time.perf_counter() - began
        return table

    def _build(self, grammar: str | None) -> _State:
        import llguidance

        assert grammar is not None
        if self._table is None:  # `start` was never called: this first grammar pays for it
            table: Future[llguidance.LLTokenizer] = Future()
            try:
                table.set_result(self._build_table())
            except Exception as e:
                table.set_exception(e)
            self._table = table
        return _State(llguidance.LLMatcher(self._table.result(), grammar, log_level=0))


_DEAD_END = (
    "no token can continue its output: every token its grammar allows next is banned "
    "(min_tokens bans EOS and stop_token_ids; bad_words)"
)


def _banned(s: ScheduledRequest) -> list[int]:
    """The tokens the logits processors will ban in this request's row (-inf: final)."""
    i = s.logits_inputs
    if i is None:
        return []
    return list(i.banned_token_ids) + bad_word_bans(i.output_token_ids, s.params.bad_words)


def _allows_any(row: torch.Tensor, banned: Sequence[int]) -> bool:
    """Whether bitmask `row` [V/32] allows a token outside `banned` (a few dozen at most)."""
    if not banned:
        return bool(row.any())
    cleared: dict[int, int] = {}
    for t in banned:
        cleared[t // 32] = cleared.get(t // 32, 0) | 1 << (t % 32)
    cleared = {w: bits for w, bits in cleared.items() if w < row.shape[0]}
    others = row.clone()
    others[list(cleared)] = 0
    if bool(others.any()):  # a word without a banned token allows something
        return True
    return any(int(row[w]) & 0xFFFFFFFF & ~bits for w, bits in cleared.items())


def _bit(i: int) -> int:
    """Bit i of an int32 word as a Python int (bit 31 is the sign bit)."""
    return -(1 << 31) if i == 31 else 1 << i
