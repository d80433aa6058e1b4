"""top_p rows of a few-row step drawn from the int8 head's bounds, exactly (screened_sampler.py
draws the other plain sampled rows; this takes a top_p row without top_k or min_p).

A token v is in a row's top_p set S iff the mass of the tokens likelier than it, A(v), is
below (p - 1e-6) Z: the reference's rule (runner/top_p.py), the likeliest token always in.
S's edge cannot be fixed from the bounds (on Gemma 3 they are ~2.5 wide across the vocabulary:
the tail's mass is known only to a factor of ~12), but one token's membership mostly can be
once the likeliest tokens are exact. So: the RESCORE_FIRST tokens of largest ub are rescored
exactly; a row where they hold less than ROUTE_MIN_MASS of exp(ub / T) is flat and goes to the
full head (decided from the row alone, so either path draws the row's own distribution). Then
v is drawn from softmax(l / T) over the whole row (proposals from exp(ub / T), accepted with
probability exp((l_v - ub_v) / T), as screened_sampler.py), l_v is computed exactly, and
A(v) and B(v) = Z - A(v) are bounded with every token's bounds: a token whose lb is above l_v
counts in A, one whose ub is at or below it in B, one straddling l_v in either. Surely in S:
v is the draw. Surely out: the next accepted proposal. Undecided: the least certain tokens
are rescored (8 x RESCORE_FIRST, then the whole row) until it is decided. A draw from
softmax(l / T) kept only when in S is a draw from the softmax restricted to S: the top_p
distribution of the fp32 logits, exactly, up to fp32 rounding (the reference path draws from
the same with the logits rounded to bf16).

Its cost is a few passes over [rows x V] in torch, which pays only while the head's bandwidth
dominates a step: MAX_ROWS rows at most (bench/sampled_head.py --top-p).

Shapes: x [R, H] fp32 (the envelope's padded rows) -> R token ids or None (the full head's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.kernels.int8_envelope import Int8Envelope

# A step with more top_p rows takes the full head and the C top_p scan for them.
# bench/sampled_head.py --top-p 0.95, T 1, 2-core EPYC without AMX: 1.68x the full head and
# the sampler at 1 row, 1.07x at 2, 0.67x at 4 (more rows, more passes over [V] in torch)
MAX_ROWS = 2
# A row whose RESCORE_FIRST likeliest tokens (by ub) hold less of exp(ub / T) is flat (random-
# token prompts at T 1: 0.3-0.9; plain words 0.98-1.0 on Gemma 3): the full head draws it, and
# the request's next REPROBE tokens without the envelope's pass
ROUTE_MIN_MASS = 0.97
REPROBE = 8
PROPOSALS = 16  # per round, drawn together
ROUNDS = 8
RESCORE_FIRST = 2048
MARGIN = 1e-5  # relative, on the bounded sums: float32 exp and rounding, well past 1e-7
RULE = 1e-6  # the reference's "reaches p": to 1e-6 of the mass


@dataclass
class TopPStats:
    rows: int = 0
    checks: int = 0  # memberships decided
    outside: int = 0  # drawn tokens found outside the set (drawn again)
    routed: int = 0  # flat rows sent to the full head
    rescored: int = 0  # tokens rescored to decide a membership
    violations: int = 0  # an exact logit outside its bounds (must stay 0)


@dataclass
class _Bounds:
    """One row's per-token bounds over T, relative to the row's largest ub: u >= l / T >= w,
    eu = exp(u - top), ew = exp(w - top). Rescored tokens get u = w = their exact l / T."""

    proposal: torch.Tensor  # [V] float32 ub / T as the envelope gave it
    u: torch.Tensor  # [V]
    w: torch.Tensor  # [V]
    mass: torch.Tensor  # [2, V] eu, ew
    top: float
    known: torch.Tensor  # [V] bool: rescored
    total: tuple[float, float] = (0.0, 0.0)  # sums of eu and ew (float64)

    def __post_init__(self) -> None:
        self.sum_up()

    @property
    def eu(self) -> torch.Tensor:
        return self.mass[0]

    @property
    def ew(self) -> torch.Tensor:
        return self.mass[1]

    def sum_up(self) -> None:
        t = self.mass.sum(dim=1, dtype=torch.float64).tolist()
        self.total = (t[0], t[1])


class ScreenedTopP:
    def __init__(self, env: Int8Envelope, weight: torch.Tensor, gen: torch.Generator) -> None:
        self.env = env
        self.weight = weight  # [V, H] bf16, H padded as the envelope's x
        self.gen = gen
        self.stats = TopPStats()
        self._flat: dict[str, int] = {}  # request id -> the output length to probe again at

    def __call__(self, x: torch.Tensor, reqs: Sequence[ScheduledRequest]) -> list[int | None]:
        """x [R, H] fp32 padded rows whose requests have 0 < top_p < 1 (and pass
        screened_sampler.screened_row); None for a row the full head is to draw."""
        out: list[int | None] = [None] * len(reqs)
        self.stats.rows += len(reqs)
        probe = [j for j, r in enumerate(reqs) if self._flat.get(r.request_id, -1) <= _at(r)]
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
            bounds = self._bounds(x[n], ub[n] * inv_t[n], lb[n] * inv_t[n], float(inv_t[n]))
            if bounds is None:  # flat: the full head's, for REPROBE tokens
                self._flat[r.request_id] = _at(r) + REPROBE
                self.stats.routed += 1
                continue
            out[j] = self._draw(x[n], bounds, float(inv_t[n]), r.params.top_p)
        return out

    def _bounds(
        self, x: torch.Tensor, u: torch.Tensor, w: torch.Tensor, inv_t: float
    ) -> _Bounds | None:
        """The row's bounds with its RESCORE_FIRST likeliest tokens (by ub) exact, or None
        where those hold less than ROUTE_MIN_MASS of exp(ub / T): a flat row, whose
        memberships would need most of the row rescored."""
        top = float(u.max())
        mass = torch.exp(torch.stack([u, w]) - top)  # [2, V]
        first = mass[0].topk(min(RESCORE_FIRST, len(u)))
        if float(first.values.sum()) < ROUTE_MIN_MASS * float(mass[0].sum()):
            return None
        known = torch.zeros(len(u), dtype=torch.bool)
        b = _Bounds(u, u.clone(), w, mass, top, known)
        self._rescore(x, b, first.indices, inv_t)
        return b

    def _dots(self, x: torch.Tensor, tokens: torch.Tensor | None) -> torch.Tensor:
        """[n] fp32 logits x . w_t (x [H] fp32) of the tokens, or of the whole vocabulary."""
        if tokens is not None:
            return self.weight[tokens].float() @ x
        v, step = len(self.weight), 16384
        return torch.cat([self.weight[at : at + step].float() @ x for at in range(0, v, step)])

    def _draw(self, x: torch.Tensor, bounds: _Bounds, inv_t: float, p: float) -> int | None:
        """A draw from softmax(l / T) over the proposal exp(u), kept when inside the set."""
        u = bounds.proposal
        cdf = torch.exp(u - bounds.top).double().cumsum(0)  # float64: exp(u) to 1e-16
        known_in, known_out = float("inf"), float("-inf")  # S is {l >= some edge}
        for _ in range(ROUNDS):
            r = torch.rand(PROPOSALS, dtype=torch.float64, generator=self.gen) * cdf[-1]
            tokens = torch.searchsorted(cdf, r, right=True).clamp_(max=len(u) - 1)
            lam = self._dots(x, tokens) * inv_t  # [P] exact l / T
            upper = u[tokens]
            if bool((lam > upper).any()):
                self.stats.violations += 1
                return None  # a capped acceptance would be biased: the full head's
            accept = torch.rand(PROPOSALS, generator=self.gen) < torch.exp(lam - upper)
            for t, lv in zip(tokens[accept].tolist(), lam[accept].tolist(), strict=True):
                if lv >= known_in or (lv > known_out and self._inside(x, bounds, lv, inv_t, p)):
                    known_in = min(known_in, lv)
                    return int(t)
                known_out = max(known_out, lv)
                self.stats.outside += 1
        return None

    def _inside(self, x: torch.Tensor, b: _Bounds, lam: float, inv_t: float, p: float) -> bool:
        """Whether a token of exact l / T = lam is in the row's top_p set."""
        self.stats.checks += 1
        goal, k = p - RULE, RESCORE_FIRST * 8
        while True:
            above = torch.stack([b.u > lam, b.w > lam])  # [2, V] may be / surely likelier
            if bool(b.known.all()):  # every logit exact: the rule itself, in float64
                a = float(b.eu.double() @ above[0].double())
                return a < goal * float(b.eu.sum(dtype=torch.float64))
            # [[eu, ew] . [may, surely]]: the four masked sums in one float32 product
            (a_may, a_sure), (w_may, w_sure) = (b.mass @ above.T.float()).tolist()
            a_hi, a_lo = a_may * (1 + MARGIN), w_sure * (1 - MARGIN)
            b_hi = (b.total[0] - a_sure) * (1 + MARGIN)  # eu of the tokens not surely above
            b_lo = (b.total[1] - w_may) * (1 - MARGIN)  # ew of the tokens surely not above
            if a_hi < goal * (a_hi + b_lo):
                return True
            if a_lo >= goal * (a_lo + b_hi):
                return False
            if k < len(b.u) // 8:
                unsure = torch.where(above[0] & ~above[1], b.eu, b.eu - b.ew)
                self._rescore(x, b, unsure.masked_fill_(b.known, -1.0).topk(k).indices, inv_t)
            else:
                self._rescore(x, b, None, inv_t)
            k *= 8

    def _rescore(
        self, x: torch.Tensor, b: _Bounds, tokens: torch.Tensor | None, inv_t: float
    ) -> None:
        """The tokens' l / T made exact in b (None: the whole row)."""
        exact = self._dots(x, tokens) * inv_t
        if tokens is None:
            tokens = torch.arange(len(b.u))
        if bool(((exact > b.u[tokens]) | (exact < b.w[tokens])).any()):
            self.stats.violations += 1  # counted; the sums below use the exact values
        b.u[tokens] = exact
        b.w[tokens] = exact
        b.mass[:, tokens] = torch.exp(exact - b.top)
        b.known[tokens] = True
        b.sum_up()
        self.stats.rescored += len(tokens)


def _at(r: ScheduledRequest) -> int:
    return r.num_output_tokens
