"""top_p rows of a few-row step drawn from the int8 head's bounds, exactly (screened_sampler.py
draws the other plain sampled rows; this takes a top_p row without top_k or min_p).

A token v is in a row's top_p set S iff the mass of the tokens likelier than it, A(v), is
below (p - 1e-6) Z: the reference's rule (runner/top_p.py), the likeliest token always in.
S's edge cannot be fixed from the bounds (on Gemma 3 they are ~2.5 wide across the vocabulary:
the tail's mass is known only to a factor of ~12), but one token's membership mostly can be
once the likeliest tokens are exact. So:

1. The head: the tokens of largest ub, whole buckets of 1/16 nat below the row's top, at most
   RESCORE_FIRST of them (kernels/screened_row.c), rescored exactly. A row where they hold
   less than ROUTE_MIN_MASS of exp(ub / T) is flat and goes to the full head (decided from the
   row alone, so either way the row's own distribution is drawn from).
2. v is drawn from softmax(l / T) by rejection from a proposal that is exact on the head and
   exp(ub / T) on the tail: a head token is always accepted, a tail token with probability
   exp((l_v - ub_v) / T) <= 1.
3. Where l_v is at least every tail token's ub, A(v) is an exact sum over the head and B(v) =
   Z - A(v) is the head's rest plus the tail's mass, bounded by its lb and ub sums: that mostly
   decides. Otherwise top_p_membership.py decides from every token's bounds, rescoring more.
   Surely in S: v is the draw. Out: the next accepted proposal.

A draw from softmax(l / T) kept only when in S is a draw from the softmax restricted to S: the
top_p distribution of the fp32 logits, exactly, up to fp32 rounding (the tail's proposal
weights exp(ub / T - top) come from fast_exp.h, relative error ~2e-7; the reference path draws
from the same with the logits rounded to bf16).

Shapes: x [R, H] fp32 (the envelope's padded rows) -> R token ids or None (the full head's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.top_p_membership import MARGIN, RULE, Rescorer, RowBounds, inside
from headrace.kernels.int8_envelope import Int8Envelope
from headrace.kernels.screened_row import row_head, rows_dot

# A step with more top_p rows takes the full head and the C top_p scan for them:
# bench/sampled_head.py --top-p 0.95 --temperatures 1.0 (2-core EPYC without AMX, 2026-12-06,
# with the row's head in C) put this path at 2.2x the full head and the sampler at 1 row, 1.9x
# at 2, 1.54x at 3, 1.46x at 4, 1.16x at 6 (docs/img/sampled_head_topp_1206b.json).
MAX_ROWS = 4
# A row whose head holds less of exp(ub / T) is flat (random-token prompts at T 1: 0.3-0.9;
# plain words 0.98-1.0 on Gemma 3): the full head draws it, and the request's next REPROBE
# tokens without the envelope's pass; each further flat probe doubles the wait, up to
# MAX_REPROBE (a flat context stays flat: a probe is an envelope's pass on top of the head's).
ROUTE_MIN_MASS = 0.97
REPROBE = 8
MAX_REPROBE = 256
RESCORE_FIRST = 2048
PROPOSALS = 16  # per round, drawn together
ROUNDS = 8


@dataclass
class TopPStats:
    rows: int = 0
    checks: int = 0  # memberships decided
    slow: int = 0  # ... of them by top_p_membership.py
    outside: int = 0  # drawn tokens found outside the set (drawn again)
    routed: int = 0  # flat rows sent to the full head
    rescored: int = 0  # tokens rescored
    violations: int = 0  # an exact logit outside its bounds (must stay 0)


@dataclass
class _Row:
    x: torch.Tensor  # [H] fp32
    u: torch.Tensor  # [V] float32 ub / T, w lb / T
    w: torch.Tensor
    inv_t: float
    top: float  # max u
    head: torch.Tensor  # [K] token ids
    lam: torch.Tensor  # [K] float32 their exact l / T
    head_mass: torch.Tensor  # [K] float64 exp(lam - top)
    head_total: float  # their sum: the proposal's mass on the head
    tail_eu: torch.Tensor  # [V] float32 exp(u - top), 0 on the head
    tail_hi: float  # the tail's mass: at most this, at least tail_lo
    tail_lo: float
    tail_top: float  # no tail token's ub / T is above it
    tail_cdf: torch.Tensor | None = None
    bounds: RowBounds | None = None


class ScreenedTopP:
    def __init__(self, env: Int8Envelope, weight: torch.Tensor, gen: torch.Generator) -> None:
        self.env = env
        self.weight = weight  # [V, H] bf16, H padded as the envelope's x
        self.gen = gen
        self.stats = TopPStats()
        # request id -> (the output length to probe again at, the wait that set it)
        self._flat: dict[str, tuple[int, int]] = {}

    def waits(self, r: ScheduledRequest) -> bool:
        """Whether r's rows are flat for a while yet: the full head's, without a probe."""
        return _at(r) < self._flat.get(r.request_id, (-1, 0))[0]

    def __call__(self, x: torch.Tensor, reqs: Sequence[ScheduledRequest]) -> list[int | None]:
        """x [R, H] fp32 padded rows whose requests have 0 < top_p < 1 (and pass
        screened_sampler.screened_row); None for a row the full head is to draw."""
        out: list[int | None] = [None] * len(reqs)
        self.stats.rows += len(reqs)
        probe = [j for j, r in enumerate(reqs) if not self.waits(r)]
        if len(self._flat) > 4096:  # finished requests' entries: forgetting one costs a probe
            self._flat.clear()
        if not probe:
            return out
        x = x[probe].contiguous()  # the C scan reads rows densely
        inv_t = torch.tensor([1.0 / reqs[j].params.temperature for j in probe])
        _, ub, lb = self.env.envelope(x, inv_t, every=True)
        assert ub is not None and lb is not None
        for n, j in enumerate(probe):
            r = reqs[j]
            row = self._row(x[n], ub[n], lb[n], float(inv_t[n]))
            if row is None:  # flat: the full head's, for a while
                self._wait(r)
                self.stats.routed += 1
                continue
            self._flat.pop(r.request_id, None)
            out[j] = self._draw(row, r.params.top_p)
        return out

    def _wait(self, r: ScheduledRequest) -> None:
        """REPROBE tokens after a first flat probe, twice the last wait after another (a
        speculating step's rows of one request probe together: they count once)."""
        at, last = self._flat.get(r.request_id, (-1, 0))
        if at > _at(r):
            return
        wait = min(2 * last, MAX_REPROBE) if last else REPROBE
        self._flat[r.request_id] = (_at(r) + wait, wait)

    def _dots(self, x: torch.Tensor, tokens: torch.Tensor | None) -> torch.Tensor:
        """[n] fp32 logits x . w_t (x [H] fp32) of the tokens, or of the whole vocabulary: by
        one kernel, so that a token rescored twice gets the same value (its bound is then a
        point, and a second value one ulp off would be a broken bound)."""
        if tokens is None:
            tokens = torch.arange(len(self.weight))
        self.stats.rescored += len(tokens)
        return rows_dot(x, self.weight, tokens)

    def _row(
        self, x: torch.Tensor, ub: torch.Tensor, lb: torch.Tensor, inv_t: float
    ) -> _Row | None:
        """The row with its head exact, or None where the head holds too little of exp(u).
        ub, lb [V] become u = ub / T and w = lb / T in place."""
        h = row_head(ub, lb, inv_t, RESCORE_FIRST)
        if h.on_head < ROUTE_MIN_MASS * h.total:
            return None
        lam = self._dots(x, h.head) * inv_t
        self.stats.violations += int((lam > ub[h.head]).sum())
        mass = torch.exp(lam.double() - h.top)
        return _Row(
            x, ub, lb, inv_t, h.top, h.head, lam, mass, float(mass.sum()), h.tail_eu, h.tail_hi,
            h.tail_lo, h.tail_top,
        )  # fmt: skip

    def _draw(self, row: _Row, p: float) -> int | None:
        """A draw from softmax(l / T), kept when inside the set (None: no proposal accepted in
        ROUNDS x PROPOSALS, or a bound broken: the full head's)."""
        cdf = row.head_mass.cumsum(0)
        z_head = row.head_total
        known_in, known_out = float("inf"), float("-inf")  # S is {l >= some edge}
        for _ in range(ROUNDS):
            r = torch.rand(PROPOSALS, dtype=torch.float64, generator=self.gen)
            r *= z_head + row.tail_hi
            on_head = r < z_head
            at = torch.searchsorted(cdf, r.clamp(max=z_head), right=True).clamp_(max=len(cdf) - 1)
            tokens, lam = row.head[at], row.lam[at]
            accept = torch.ones(PROPOSALS, dtype=torch.bool)
            if not bool(on_head.all()):
                tail = (~on_head).nonzero().flatten()
                t, exact, ok = self._from_tail(row, r[tail] - z_head)
                if ok is None:
                    return None
                tokens[tail], lam[tail], accept[tail] = t, exact, ok
            for t, lv in zip(tokens[accept].tolist(), lam[accept].tolist(), strict=True):
                if lv >= known_in or (lv > known_out and self._inside(row, lv, p)):
                    return int(t)
                known_out = max(known_out, lv)
                self.stats.outside += 1
        return None

    def _from_tail(
        self, row: _Row, r: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Tail proposals at r (in [0, tail_hi)): their tokens, exact l / T, and acceptance
        (None: a bound broken)."""
        if row.tail_cdf is None:
            row.tail_cdf = row.tail_eu.double().cumsum(0)
        tokens = torch.searchsorted(row.tail_cdf, r, right=True).clamp_(max=len(row.u) - 1)
        exact = self._dots(row.x, tokens) * row.inv_t
        upper = row.u[tokens]
        if bool((exact > upper).any()):
            self.stats.violations += 1
            return tokens, exact, None  # a capped acceptance would be biased
        ok = torch.rand(len(r), generator=self.gen) < torch.exp(exact - upper)
        return tokens, exact, ok

    def _inside(self, row: _Row, lam: float, p: float) -> bool:
        """Whether a token of exact l / T = lam is in the row's top_p set."""
        self.stats.checks += 1
        goal = p - RULE
        if lam >= row.tail_top:  # no tail token likelier: A is exact
            a = float(row.head_mass[row.lam > lam].sum())
            rest = row.head_total - a
            a_hi, a_lo = a * (1 + MARGIN), a * (1 - MARGIN)
            if a_hi < goal * (a_hi + (rest + row.tail_lo) * (1 - MARGIN)):
                return True
            if a_lo >= goal * (a_lo + (rest + row.tail_hi) * (1 + MARGIN)):
                return False
        self.stats.slow += 1
        if row.bounds is None:
            row.bounds = RowBounds.of(row.u, row.w, row.top)
            row.bounds.set_exact(row.head, row.lam)
        before = row.bounds.violations
        verdict = inside(row.bounds, lam, p, self._rescorer(row), 8 * RESCORE_FIRST)
        self.stats.violations += row.bounds.violations - before
        return verdict

    def _rescorer(self, row: _Row) -> Rescorer:
        return lambda tokens: self._dots(row.x, tokens) * row.inv_t


def _at(r: ScheduledRequest) -> int:
    return r.num_output_tokens
