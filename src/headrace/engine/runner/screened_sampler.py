"""Sampled rows drawn from the int8 head, exactly: no full-precision head, no [rows x V] fp32
softmax (the reference path, sampler.py, has both).

The int8 head bounds every token's fp32 logit l_v = x . w_v: lb_v <= l_v <= ub_v
(kernels/int8_envelope.py). A row with temperature T draws by rejection: propose v with
probability proportional to exp(ub_v / T) (a group of 16 tokens by its mass, then a token of
it), compute l_v exactly (fp32, from the bf16 row of the head), accept with probability
exp((l_v - ub_v) / T) <= 1, else propose again. An accepted token is an exact draw from
softmax(l / T) over the fp32 logits (the reference path rounds the logits to bf16 first).
 - min_p: the largest logit is rescored exactly among the tokens whose ub reaches max lb;
   tokens with l_v < l_max + T ln(min_p) are not allowed: groups whose max ub is below that
   leave the proposal, and a proposal below it is rejected.
 - top_k (up to MAX_TOP_K): the tokens whose ub reaches the k-th largest group max lb include
   every token of the top k (ties too); all are rescored exactly and the reference sampler's
   own steps (min_p, top_k, top_p, softmax, its uniform) run on those few logits.
 - top_p without top_k or min_p, in a step with at most MAX_TOP_P_ROWS of them:
   screened_top_p.py (a draw from the whole softmax kept when its membership is proven).
Rows this path does not take (see `screened_row`) and rows whose proposals all failed
(ROUNDS x PROPOSALS of them) return None: the caller takes the full head for them.

Shapes: hidden [R, H] -> R token ids or None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.screened_top_p import MAX_ROWS as MAX_TOP_P_ROWS
from headrace.engine.runner.screened_top_p import ScreenedTopP
from headrace.kernels.int8_envelope import OUTLIERS, GroupEnvelope, Int8Envelope
from headrace.kernels.int8_head import Int8GreedyHead
from headrace.request import SamplingParams

MAX_TOP_K = 1024  # past it the candidates are many: the reference path
# Below it the bound (~0.1-0.3 wide) is many temperatures wide: few proposals are accepted.
MIN_TEMPERATURE = 0.2
PROPOSALS = 12  # per row and round, drawn together
ROUNDS = 6
MAX_GROUPS = 512  # a min_p row with its allowed tokens in at most these: rescored, no rejection
# Most sampled rows of a step it draws with VNNI and no AMX, where the two-limb scan makes as
# many multiply-adds as the bf16 head's matmul: past 8-12 rows the full head and the C sampler
# are faster (docs/performance.md, 2026-12-07). With AMX the scan runs on tiles: no bound.
VNNI_MAX_ROWS = 8


def screened_row(r: ScheduledRequest, vocab: int) -> bool:
    """A sampled row this path draws exactly: no processors, logprobs, grammar or seed (a
    seeded request's tokens must not depend on its batch, which sets the int8 rows' scales),
    top_p with a top_k, or without one and without min_p (screened_top_p.py)."""
    p = r.params
    if p.greedy or p.logprobs is not None or p.grammar is not None or p.seed is not None:
        return False
    if r.logits_inputs is not None:
        return False
    if 0 < p.top_k < vocab:
        return p.top_k <= MAX_TOP_K
    return p.temperature >= MIN_TEMPERATURE and (p.top_p >= 1.0 or p.min_p == 0)


def _top_p_alone(p: SamplingParams, vocab: int) -> bool:
    return p.top_p < 1.0 and not 0 < p.top_k < vocab


@dataclass
class ScreenStats:
    """Counters since the sampler was made (the benchmark and tests read them)."""

    rows: int = 0
    proposals: int = 0  # rejection path: proposals made
    accepted: int = 0  # rejection path: rows accepted
    rescored: int = 0  # exact logits computed (proposals and candidates)
    fallbacks: int = 0  # rows handed back to the full head
    violations: int = 0  # l_v > ub_v seen (the bound broken: must stay 0)


class ScreenedSampler:
    min_rows = 1  # fewest plain sampled rows a step hands it: every step (or a deployment's)

    def __init__(
        self,
        head: Int8GreedyHead,
        seed: int | None = None,
        few_rows: int = 0,
        outliers: int = OUTLIERS,
        max_rows: int | None = None,
    ) -> None:
        """few_rows: a step with at most these sampled rows leaves them to the full head, which
        the model has that cheap for so few (head_picks.py); outliers: the envelope's heavy
        channels (int8_envelope.py); max_rows: a step with more sampled rows than this leaves
        them to the full head, which is then faster (None: no bound; VNNI_MAX_ROWS)."""
        self.max_rows = max_rows
        self.few_rows = few_rows
        self.env = Int8Envelope(head, outliers)
        self.weight = head.weight  # [V, H] bf16, H padded as the envelope's x
        self.vocab = self.env.vocab
        self.gen = torch.Generator()
        if seed is None:
            self.gen.seed()
        else:
            self.gen.manual_seed(seed)
        self.stats = ScreenStats()
        self.top_p = ScreenedTopP(self.env, self.weight, self.gen)

    def worth(self, rows: int) -> bool:
        """Whether a step with `rows` rows for the full head should bring its plain sampled
        ones here (few_rows < rows <= max_rows)."""
        return self.few_rows < rows and (self.max_rows is None or rows <= self.max_rows)

    def takes(self, r: ScheduledRequest) -> bool:
        """Whether r's row is this sampler's to draw now: `screened_row`, and not a top_p row
        known to be flat for a while (screened_top_p.py)."""
        if not screened_row(r, self.vocab):
            return False
        return not (_top_p_alone(r.params, self.vocab) and self.top_p.waits(r))

    def __call__(
        self, hidden: torch.Tensor, reqs: Sequence[ScheduledRequest], sampler: Sampler
    ) -> list[int | None]:
        """hidden [R, H] of rows that pass `screened_row`; `sampler` draws the top_k rows'
        few logits (its uniform numbers)."""
        x = self.env.padded(hidden)  # [R, H] fp32
        nucleus = [i for i, r in enumerate(reqs) if _top_p_alone(r.params, self.vocab)]
        if nucleus:
            return self._split(x, reqs, nucleus, sampler)
        inv_t = torch.tensor([1.0 / r.params.temperature for r in reqs])
        summary, _, _ = self.env.envelope(x, inv_t)
        out: list[int | None] = [None] * len(reqs)
        everyone = list(range(len(reqs)))
        floor = torch.maximum(
            self._min_p_floor(x, summary, reqs, everyone, inv_t),
            self._top_k_floor(summary, reqs),
        )  # [R] the least logit a row may draw
        near = (summary.gmax >= floor[:, None]).sum(dim=1)  # groups that may hold one
        compact = [
            i
            for i, r in enumerate(reqs)
            if 0 < r.params.top_k < self.vocab or (r.params.min_p > 0 and near[i] <= MAX_GROUPS)
        ]
        rest = sorted(set(everyone) - set(compact))
        if compact:
            self._compact(x, summary, reqs, compact, floor[compact], sampler, out)
        if rest:
            self._reject(x, summary, inv_t, rest, floor[rest], out)
        self.stats.rows += len(reqs)
        self.stats.fallbacks += sum(t is None for t in out)
        return out

    def _split(
        self,
        x: torch.Tensor,
        reqs: Sequence[ScheduledRequest],
        nucleus: list[int],
        sampler: Sampler,
    ) -> list[int | None]:
        """A step with top_p rows: those by screened_top_p.py (a few) or the full head's."""
        out: list[int | None] = [None] * len(reqs)
        if len(nucleus) <= MAX_TOP_P_ROWS:
            picks = self.top_p(x[nucleus], [reqs[i] for i in nucleus])
            for i, t in zip(nucleus, picks, strict=True):
                out[i] = t
        self.stats.rows += len(nucleus)
        self.stats.fallbacks += sum(out[i] is None for i in nucleus)
        rest = sorted(set(range(len(reqs))) - set(nucleus))
        if rest:
            for i, t in zip(rest, self(x[rest], [reqs[i] for i in rest], sampler), strict=True):
                out[i] = t
        return out

    def _exact(self, x: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[n] fp32 logits x[rows[i]] . w[tokens[i]]."""
        self.stats.rescored += len(tokens)
        return (x[rows] * self.weight[tokens].float()).sum(-1)

    def _candidates(
        self, x: torch.Tensor, summary: GroupEnvelope, rows: list[int], floor: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every token of rows[j] whose ub reaches floor[j], rescored: (j, token, logit) [n]."""
        near = summary.gmax[rows] >= floor[:, None]  # [r, G]
        j, groups = near.nonzero(as_tuple=True)
        row_ids = torch.tensor(rows, dtype=torch.int64)[j]
        ub, _ = self.env.group_bounds(x, row_ids, groups)  # [n, 16]
        pair, lane = ((ub >= floor[j][:, None]) & (ub > float("-inf"))).nonzero(as_tuple=True)
        tokens = groups[pair] * 16 + lane
        return j[pair], tokens, self._exact(x, row_ids[pair], tokens)

    def _top_k_floor(
        self, summary: GroupEnvelope, reqs: Sequence[ScheduledRequest]
    ) -> torch.Tensor:
        """[R] the k-th largest group max lb: at most the k-th largest logit (-inf: no top_k)."""
        floor = torch.full((len(reqs),), float("-inf"))
        for i, r in enumerate(reqs):
            if 0 < r.params.top_k < self.vocab and r.params.top_k <= summary.glow.shape[1]:
                floor[i] = summary.glow[i].topk(r.params.top_k).values[-1]
        return floor

    def _compact(
        self,
        x: torch.Tensor,
        summary: GroupEnvelope,
        reqs: Sequence[ScheduledRequest],
        rows: list[int],
        floor: torch.Tensor,
        sampler: Sampler,
        out: list[int | None],
    ) -> None:
        """Rows whose allowed tokens all have ub >= floor: those rescored, the reference steps
        run on them."""
        which, tokens, logits = self._candidates(x, summary, rows, floor)
        counts = torch.bincount(which, minlength=len(rows))
        at = torch.arange(len(which)) - (counts.cumsum(0) - counts)[which]  # place in its row
        width = int(counts.max())
        table = torch.full((len(rows), width), float("-inf"))  # [r, C] -inf past a row's own
        table[which, at] = logits
        ids = torch.zeros(len(rows), width, dtype=torch.int64)
        ids[which, at] = tokens
        picks = sampler._draw(table, [reqs[i] for i in rows])  # the reference steps
        for i, t in zip(rows, ids.gather(1, picks[:, None]).squeeze(1).tolist(), strict=True):
            out[i] = t

    def _reject(
        self,
        x: torch.Tensor,
        summary: GroupEnvelope,
        inv_t: torch.Tensor,
        rows: list[int],
        allowed: torch.Tensor,
        out: list[int | None],
    ) -> None:
        """Rejection from exp(ub / T); `allowed` [r]: the least logit each row may draw."""
        row_ids = torch.tensor(rows, dtype=torch.int64)
        it = inv_t[row_ids]  # [r]
        log_mass = summary.log_mass(inv_t)[row_ids]  # [r, G]
        log_mass[summary.gmax[row_ids] < allowed[:, None]] = float("-inf")
        active = torch.arange(len(rows))
        for _ in range(ROUNDS):
            j, tokens, upper = self._propose(x, row_ids, it, log_mass, active)
            logits = self._exact(x, row_ids[j], tokens)
            broken = (logits > upper).view(len(active), PROPOSALS).any(dim=1)
            self.stats.violations += int(broken.sum())
            u = torch.rand(len(tokens), generator=self.gen)
            ok = (u < torch.exp((logits - upper) * it[j])) & (logits >= allowed[j])
            ok = ok.view(len(active), PROPOSALS)
            first = ok.int().argmax(dim=1)  # the first accepted proposal of each row
            # A row whose bound broke would draw with a capped acceptance, biased: it goes
            # back to the full head (None) instead.
            done = ok.any(dim=1) & ~broken
            self.stats.proposals += int(torch.where(done, first + 1, PROPOSALS).sum())
            self.stats.accepted += int(done.sum())
            chosen = tokens.view(len(active), PROPOSALS).gather(1, first[:, None]).squeeze(1)
            for a, t in zip(active[done].tolist(), chosen[done].tolist(), strict=True):
                out[rows[a]] = t
            active = active[~done & ~broken]
            if not len(active):
                return

    def _propose(
        self,
        x: torch.Tensor,
        row_ids: torch.Tensor,
        it: torch.Tensor,
        log_mass: torch.Tensor,
        active: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """PROPOSALS tokens of each active row from exp(ub / T), a group by its mass and then a
        token of it: (j, token, ub) [n], j the proposal's index into the rows."""
        probs = torch.softmax(log_mass[active], dim=-1)
        groups = torch.multinomial(probs, PROPOSALS, replacement=True, generator=self.gen)
        j = active.repeat_interleave(PROPOSALS)  # [n] index into rows
        ub, _ = self.env.group_bounds(x, row_ids[j], groups.flatten())  # [n, 16]
        lane_probs = torch.softmax(ub * it[j][:, None], dim=-1)
        lane = torch.multinomial(lane_probs, 1, generator=self.gen).squeeze(1)
        tokens = groups.flatten() * 16 + lane
        return j, tokens, ub.gather(1, lane[:, None]).squeeze(1)

    def _min_p_floor(
        self,
        x: torch.Tensor,
        summary: GroupEnvelope,
        reqs: Sequence[ScheduledRequest],
        rows: list[int],
        inv_t: torch.Tensor,
    ) -> torch.Tensor:
        """[r] the least allowed logit of each row: l_max + T ln(min_p) (-inf without min_p)."""
        floor = torch.full((len(rows),), float("-inf"))
        with_p = [j for j, i in enumerate(rows) if reqs[i].params.min_p > 0]
        if not with_p:
            return floor
        sub = [rows[j] for j in with_p]
        which, _, logits = self._candidates(x, summary, sub, summary.glow[sub].amax(dim=1))
        top = torch.full((len(sub),), float("-inf")).scatter_reduce(0, which, logits, "amax")
        for n, j in enumerate(with_p):
            p = reqs[rows[j]].params.min_p
            floor[j] = top[n] + math.log(p) / float(inv_t[j])
        return floor
