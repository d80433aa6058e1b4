"""A step's picks with the screened sampler: plain sampled rows are drawn from the int8 head
(the full head never sees them); seeded, logprobs, processor and greedy rows keep their paths,
as do all sampled rows of a speculating step with a row the screened sampler cannot draw or
more than head_picks.WITH_DRAFTS rows (else its draft rows are drawn there too), the top_p
rows of a step with more than screened_top_p.MAX_ROWS of them, and the sampled rows of a step
with at most the screened sampler's `few_rows` of them (a model with a cheap few-row head) or
more than its `max_rows` (a CPU without AMX, where the full head is then faster)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headrace.engine.outputs import LogitsInputs, ScheduledRequest
from headrace.engine.runner import screened_top_p
from headrace.engine.runner.head_picks import pick_tokens
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.screened_sampler import ScreenedSampler
from headrace.engine.runner.structured import GrammarMasks
from headrace.kernels.int8_head import Int8GreedyHead, supported
from headrace.request import SamplingParams

pytestmark = pytest.mark.skipif(
    not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
    reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
)


def _req(rid: str, inputs: LogitsInputs | None = None, **params: float | int) -> ScheduledRequest:
    return ScheduledRequest(rid, [1], 0, [0], True, SamplingParams(**params), 0, inputs)  # type: ignore[arg-type]


def test_plain_sampled_rows_skip_the_full_head() -> None:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(2000, 64, generator=gen) * 0.05).bfloat16()
    head = Int8GreedyHead(w)
    reqs = [
        _req("plain"),
        _req("greedy", temperature=0.0),
        _req("seeded", seed=1),
        _req("logprobs", logprobs=2),
        _req("top_p", top_p=0.9),
        _req("top_k", top_k=20, top_p=0.9),
        _req("min_p", temperature=0.8, min_p=0.1),
        _req("penalty", LogitsInputs([5], [], ()), presence_penalty=1.0),
    ]
    rows = torch.randn(len(reqs), 64, generator=gen).bfloat16()
    seen: list[torch.Tensor] = []

    def full_head(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x @ w.t()

    grammars = GrammarMasks(lambda: "", 2000, ())
    screened = ScreenedSampler(head, seed=0)
    screened.min_rows = 1
    picks = pick_tokens(rows, reqs, head, full_head, Sampler(0), grammars, screened)
    assert len(seen) == 1
    expect = rows[[2, 3, 7]]  # seeded, logprobs, processors
    assert torch.equal(seen[0], expect)
    assert screened.stats.rows == 4  # plain, top_p, top_k, min_p
    assert screened.top_p.stats.rows == 1 and screened.stats.fallbacks == 0
    assert all(0 <= t < 2000 for t in picks.tokens)
    assert picks.logprobs[3] is not None and picks.logprobs[0] is None
    # without it, every non-greedy row takes the full head, as before
    seen.clear()
    pick_tokens(rows, reqs, head, full_head, Sampler(0), grammars)
    assert torch.equal(seen[0], rows[[0, 2, 3, 4, 5, 6, 7]])


def test_a_step_with_fewer_plain_sampled_rows_than_min_rows_takes_the_full_head() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2000, 64, generator=gen).bfloat16()
    head = Int8GreedyHead(w)
    reqs = [_req("a"), _req("b")]
    rows = torch.randn(len(reqs), 64, generator=gen).bfloat16()
    seen: list[torch.Tensor] = []

    def full_head(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x @ w.t()

    screened = ScreenedSampler(head, seed=0)
    screened.min_rows = 3
    pick_tokens(
        rows, reqs, head, full_head, Sampler(0), GrammarMasks(lambda: "", 2000, ()), screened
    )
    assert torch.equal(seen[0], rows) and screened.stats.rows == 0


def test_a_step_of_few_sampled_rows_takes_a_cheap_few_row_head() -> None:
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn(2000, 64, generator=gen) * 0.05).bfloat16()
    head = Int8GreedyHead(w)
    seen: list[torch.Tensor] = []

    def full_head(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x @ w.t()

    screened = ScreenedSampler(head, seed=0, few_rows=4)
    for n, on_full_head in ((4, True), (5, False)):
        reqs = [_req(f"s{i}", top_p=0.9) if i % 2 else _req(f"s{i}") for i in range(n)]
        reqs.append(_req("greedy", temperature=0.0))  # the int8 head's, either way
        _step_goes(on_full_head, reqs, n, head, full_head, seen, screened, gen)


def test_a_step_of_more_sampled_rows_than_max_rows_takes_the_full_head() -> None:
    _, head, seen, full_head = _setup(3)
    gen = torch.Generator().manual_seed(3)
    screened = ScreenedSampler(head, seed=0, max_rows=6)
    for n, on_full_head in ((6, False), (7, True)):
        reqs = [_req(f"s{i}") for i in range(n)] + [_req("greedy", temperature=0.0)]
        _step_goes(on_full_head, reqs, n, head, full_head, seen, screened, gen)


def _step_goes(
    on_full_head: bool,
    reqs: list[ScheduledRequest],
    n: int,
    head: Int8GreedyHead,
    full_head: Any,
    seen: list[torch.Tensor],
    screened: ScreenedSampler,
    gen: torch.Generator,
) -> None:
    """One step of `reqs` (n sampled rows first): all n on the full head, or all screened."""
    seen.clear()
    rows = torch.randn(len(reqs), 64, generator=gen).bfloat16()
    before = screened.stats.rows
    grammars = GrammarMasks(lambda: "", 2000, ())
    picks = pick_tokens(rows, reqs, head, full_head, Sampler(0), grammars, screened)
    assert all(0 <= t < 2000 for t in picks.tokens)
    if on_full_head:
        assert torch.equal(seen[0], rows[:n]) and screened.stats.rows == before
    else:
        assert seen == [] and screened.stats.rows == before + n


def _setup(seed: int) -> tuple[torch.Tensor, Int8GreedyHead, list[torch.Tensor], Any]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(2000, 64, generator=gen) * 0.05).bfloat16()
    seen: list[torch.Tensor] = []

    def full_head(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x @ w.t()

    return w, Int8GreedyHead(w), seen, full_head


def test_a_speculating_steps_few_sampled_rows_all_skip_the_full_head() -> None:
    """Own rows and draft rows of plain sampled requests, at most WITH_DRAFTS of them: every
    pick (the drafts' included) comes from the screened sampler."""
    _, head, seen, full_head = _setup(2)
    drafting = _req("drafting", temperature=0.8)
    drafting.draft_token_ids.extend([7, 8])
    reqs = [drafting, _req("plain", top_p=0.9)]
    rows = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    screened = ScreenedSampler(head, seed=0)
    picks = pick_tokens(
        rows, reqs, head, full_head, Sampler(0), GrammarMasks(lambda: "", 2000, ()), screened
    )
    assert seen == [] and screened.stats.rows == 4 and screened.top_p.stats.rows == 1
    assert len(picks.draft_tokens) == 2 and all(0 <= t < 2000 for t in picks.draft_tokens)


@pytest.mark.parametrize("why", ["a seeded row", "more rows than WITH_DRAFTS"])
def test_a_step_whose_drafts_take_the_full_head_takes_it_for_its_sampled_rows(why: str) -> None:
    _, head, seen, full_head = _setup(2)
    drafting = _req("drafting", temperature=0.8)
    drafting.draft_token_ids.extend([7, 8] if why == "a seeded row" else [7, 8, 9, 10])
    other = _req("seeded", seed=3) if why == "a seeded row" else _req("plain")
    reqs = [drafting, other]
    n = 2 + len(drafting.draft_token_ids)
    rows = torch.randn(n, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    screened = ScreenedSampler(head, seed=0)
    picks = pick_tokens(
        rows, reqs, head, full_head, Sampler(0), GrammarMasks(lambda: "", 2000, ()), screened
    )
    assert torch.equal(seen[0], rows)  # both own rows, then the draft rows
    assert screened.stats.rows == 0 and len(picks.draft_tokens) == n - 2


def test_top_p_rows_past_max_rows_take_the_full_head() -> None:
    _, head, seen, full_head = _setup(4)
    n = screened_top_p.MAX_ROWS + 1
    reqs = [_req(str(i), top_p=0.9) for i in range(n)] + [_req("plain")]
    rows = torch.randn(n + 1, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    screened = ScreenedSampler(head, seed=0)
    pick_tokens(
        rows, reqs, head, full_head, Sampler(0), GrammarMasks(lambda: "", 2000, ()), screened
    )
    assert torch.equal(seen[0], rows[:n])
    assert screened.top_p.stats.rows == 0 and screened.stats.rows == n + 1


def test_a_flat_top_p_requests_speculating_step_takes_the_full_head_without_a_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A top_p request whose rows were found flat drafts on: while it waits, its own and draft
    rows go straight to the full head (no envelope pass on top of the head's)."""
    _, head, seen, full_head = _setup(6)
    monkeypatch.setattr(screened_top_p, "ROUTE_MIN_MASS", 1.01)  # every row is flat
    screened = ScreenedSampler(head, seed=0)
    req = _req("flat", top_p=0.9)
    rows = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    grammars = GrammarMasks(lambda: "", 2000, ())
    pick_tokens(rows[:1], [req], head, full_head, Sampler(0), grammars, screened)
    assert screened.top_p.stats.routed == 1 and len(seen) == 1  # probed, then the full head
    calls: list[int] = []
    real = screened.env.envelope
    monkeypatch.setattr(screened.env, "envelope", lambda *a, **k: calls.append(1) or real(*a, **k))
    req.draft_token_ids.extend([7, 8])
    picks = pick_tokens(rows, [req], head, full_head, Sampler(0), grammars, screened)
    assert not calls and torch.equal(seen[1], rows) and len(picks.draft_tokens) == 2
