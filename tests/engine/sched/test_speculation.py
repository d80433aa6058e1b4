"""Speculative decoding by prompt lookup: drafts are found where the sequence repeats itself,
the kept tokens are exactly plain decoding's (greedy, and sampled with a seed), and rejected
drafts leave nothing behind."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from factories import FakeCore, FakeRunner, fake_reference, make_prompt, make_request

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.messages import EngineCoreRequest
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.sched.ngram_proposer import NgramProposer
from headrace.engine.sched.speculation import accept, drafts_for, next_window, speculates
from headrace.request import SamplingParams

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def test_proposer_takes_what_followed_the_latest_longest_match() -> None:
    p = NgramProposer(3)
    assert p.propose([1, 2, 3, 4, 5, 9, 1, 2, 3]) == [4, 5, 9]
    # [2, 3] occurs twice; the latest occurrence wins
    assert p.propose([2, 3, 7, 7, 2, 3, 8, 8, 6, 2, 3]) == [8, 8, 6]
    # the 3-token suffix [5, 2, 3] beats the later 2-token [2, 3]
    assert p.propose([5, 2, 3, 4, 4, 4, 2, 3, 9, 9, 5, 2, 3]) == [4, 4, 4]
    assert p.propose([1, 2, 3, 4]) == []  # nothing repeats
    assert p.propose([1, 2]) == []
    assert p.propose([1, 2, 3, 1, 2, 3], limit=1) == [1]
    assert NgramProposer(0).propose([1, 2, 1, 2]) == []


def test_proposer_assumes_a_loop_goes_on() -> None:
    p = NgramProposer(5)
    assert p.propose([4, 5, 5, 5, 5]) == [5, 5, 5, 5, 5]
    assert p.propose([9, 1, 2, 1, 2]) == [1, 2, 1, 2, 1]


def test_proposer_matches_whole_tokens_only() -> None:
    # As little-endian int32, [256, 0, 0] holds the bytes of [1, 0] one byte in.
    p = NgramProposer(2, min_ngram=2)
    assert p.propose([256, 0, 0, 7, 1, 0]) == []
    assert p.propose([1, 0, 7, 256, 0, 0, 1, 0]) == [7, 256]


def test_proposer_looks_back_only_within_its_window() -> None:
    tokens = [1, 2, 3] + [50 + i for i in range(100)] + [1, 2]
    assert NgramProposer(2).propose(tokens) == [3, 50]
    assert NgramProposer(2, window=50).propose(tokens) == []


def test_accept_keeps_picks_up_to_the_first_wrong_draft() -> None:
    assert accept(7, [], []) == [7]
    assert accept(7, [7, 8, 9], [8, 9, 4]) == [7, 8, 9, 4]  # all right: one more for free
    assert accept(7, [7, 5, 9], [8, 9, 4]) == [7, 8]  # the second draft (5) was not 8
    assert accept(7, [6, 8], [8, 9]) == [7]


@pytest.mark.parametrize(
    ("params", "ok"),
    [
        ({"temperature": 0.0}, True),
        ({"temperature": 0.7}, True),
        ({"temperature": 1.0, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 3}, True),
        ({"temperature": 0.0, "logprobs": 1}, False),
        ({"temperature": 0.7, "logprobs": 0}, False),
        ({"temperature": 0.0, "presence_penalty": 0.5}, False),
        ({"temperature": 0.8, "frequency_penalty": 0.5}, False),
        ({"temperature": 0.0, "logit_bias": ((3, 1.0),)}, False),
    ],
)
def test_requests_without_logprobs_or_processors_speculate(params: dict, ok: bool) -> None:
    req = make_request("r", 8, max_tokens=8, **params)
    assert speculates(req) is ok


def test_drafts_stay_within_max_tokens_and_the_model_length() -> None:
    req = make_request("r", 8, max_tokens=3, temperature=0.0)
    req.prompt_token_ids = [1, 2, 3, 4, 1, 2, 3, 4]
    proposer = NgramProposer(4)
    assert drafts_for(req, proposer, max_model_len=100, budget=100) == [1, 2]  # 1 + 2 = 3
    assert drafts_for(req, proposer, max_model_len=9, budget=100) == [1]  # positions 8, 9
    assert drafts_for(req, proposer, max_model_len=100, budget=2) == [1]
    assert drafts_for(req, proposer, max_model_len=100, budget=1) == []


class LoopingRunner(FakeRunner):
    """A model that repeats the token `period` back, except at positions in `breaks`, where it
    says 1: prompt lookup guesses it right most of the time, and wrong at the breaks."""

    def __init__(self, period: int = 3, breaks: Sequence[int] = (), **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.period = period
        self.breaks = set(breaks)

    def _next(self, s: ScheduledRequest, end: int) -> int:
        bs = self.block_size
        history = [self.kv[s.block_ids[p // bs]][p % bs] for p in range(end)]
        assert None not in history
        return 1 if end in self.breaks else int(history[end - self.period] or 0)


def looping_reference(prompt: list[int], n: int, period: int, breaks: set[int]) -> list[int]:
    seq = list(prompt)
    while len(seq) < len(prompt) + n:
        seq.append(1 if len(seq) in breaks else seq[len(seq) - period])
    return seq[len(prompt) :]


def test_speculative_steps_give_plain_greedys_tokens_in_fewer_steps() -> None:
    breaks = {20, 27, 40}
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7, 9, 8, 5, 6, 7]
    runs = {}
    for k in (0, 4):
        core = FakeCore(runner=LoopingRunner(3, breaks), num_speculative_tokens=k)
        core.add("r", prompt, max_tokens=40, **GREEDY)
        core.run()
        sched = core.core.scheduler
        runs[k] = (core.tokens["r"], len(core.runner.steps), sched.spec_accepted_total)
        done = core.finished["r"]  # the request's own counts, as the usage ledger gets them
        assert done.num_accepted_tokens == sched.spec_accepted_total
        assert done.num_draft_tokens == sched.spec_drafted_total >= done.num_accepted_tokens
        assert core.core.block_manager.num_free_blocks == core.core.block_manager.num_blocks
    assert runs[0][0] == runs[4][0] == looping_reference(prompt, 40, 3, breaks)
    assert runs[0][2] == 0
    assert runs[4][2] > 20  # most of the 40 tokens came from accepted drafts
    assert runs[4][1] < runs[0][1] / 2


def test_a_stop_inside_accepted_drafts_ends_the_request_there() -> None:
    prompt = [5, 6, 7, 5, 6, 7]
    core = FakeCore(runner=LoopingRunner(3), num_speculative_tokens=4)
    core.add("a", prompt, max_tokens=30, temperature=0.0, stop_token_ids=(7,))
    core.add("b", prompt, max_tokens=6, **GREEDY)
    core.run()
    assert core.tokens["a"] == [5, 6, 7]  # stops at its stop token, mid-step
    assert core.tokens["b"] == [5, 6, 7, 5, 6, 7]  # exactly max_tokens
    assert core.finished["b"].finish_reason == "length"


def test_no_speculation_above_speculative_max_seqs_or_with_a_processor() -> None:
    prompts = {f"r{i}": [5, 6, 7, 5, 6, 7, i + 10] for i in range(3)}
    core = FakeCore(runner=LoopingRunner(3), num_speculative_tokens=4, speculative_max_seqs=2)
    lengths = {"r0": 4, "r1": 8, "r2": 24}  # r2 runs on alone
    for rid, prompt in prompts.items():
        core.add(rid, prompt, max_tokens=lengths[rid], **GREEDY)
    core.add("s", [5, 6, 7, 5, 6, 7], max_tokens=12, temperature=0.9, seed=1, presence_penalty=1)
    core.run()
    steps = core.runner.steps
    busy = [out for out in steps if len(out.scheduled) > 2]
    assert busy and all(not s.draft_token_ids for out in busy for s in out.scheduled)
    assert all(not s.draft_token_ids for out in steps for s in out.scheduled if s.request_id == "s")
    assert any(s.draft_token_ids for out in steps for s in out.scheduled)  # once fewer ran
    for rid, prompt in prompts.items():
        assert core.tokens[rid] == looping_reference(prompt, lengths[rid], 3, set())


def test_random_outputs_are_unchanged_with_speculation_on() -> None:
    """The hash model almost never repeats: drafts are rare and wrong, outputs the same."""
    engine = FakeCore(num_speculative_tokens=4, speculative_max_seqs=64, max_num_seqs=8)
    prompts = {f"r{i}": make_prompt(i, 5 + 7 * i) * 2 for i in range(6)}
    for rid, prompt in prompts.items():
        engine.add(rid, prompt, max_tokens=30, **GREEDY)
    engine.run()
    assert engine.core.scheduler.spec_drafted_total > 0
    for rid, prompt in prompts.items():
        assert engine.tokens[rid] == fake_reference(prompt, SamplingParams(max_tokens=30, **GREEDY))


def test_config_refuses_negative_settings() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SchedulerConfig(num_speculative_tokens=-1)


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    from headrace.engine.runner.model_runner import ModelRunner

    return ModelRunner(
        ModelConfig(model=str(tiny_model_dir), dtype="float32", device="cpu"),
        CacheConfig(block_size=4, num_kv_blocks=256),
    )


def _generate(
    runner, k: int, prompts: list[list[int]], **sampling: object
) -> tuple[dict[str, list[int]], int]:
    core = EngineCore(SchedulerConfig(num_speculative_tokens=k), runner)
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=40, **{**GREEDY, **sampling})  # type: ignore[arg-type]
        if params.seed is not None:
            params = SamplingParams(
                max_tokens=40, **{**GREEDY, **sampling, "seed": params.seed + i}
            )  # type: ignore[arg-type]
        core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
    tokens: dict[str, list[int]] = {}
    while core.has_work():
        outputs, _ = core.step()
        for o in outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        core.block_manager.check_invariants(
            {r.request_id: r.num_computed_tokens for r in core.scheduler.running}
        )
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
    return tokens, core.scheduler.spec_accepted_total


def test_a_real_model_gives_the_same_greedy_tokens_with_drafts(runner) -> None:
    """fp32 on a tiny random model, one and four requests at a time: the tokens of plain
    decoding, with most of them from accepted drafts (such a model loops)."""
    prompts = [[3 + (i * 7 + j * j) % 50 for j in range(9 + 5 * i)] for i in range(4)]
    for batch in (prompts[:1], prompts):
        plain, none = _generate(runner, 0, batch)
        fast, accepted = _generate(runner, 4, batch)
        assert none == 0
        assert fast == plain
        assert accepted > 0


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0, "top_k": 2, "seed": 5},
        {"temperature": 0.5, "top_k": 2, "seed": 7},
        {"temperature": 0.9, "top_k": 3, "top_p": 0.95, "min_p": 0.01, "seed": 11},
    ],
)
def test_a_seeded_sampled_request_draws_the_same_tokens_with_drafts(runner, sampling) -> None:
    """Speculative sampling keeps the distribution: every kept token, drafted or not, is the
    draw plain decoding makes at that output index (the seed's number there, the model's
    distribution given the tokens before), so a seeded request's tokens are the same with and
    without drafts, one request or four at a time, while drafts are accepted (a small top-k
    makes the tiny random model repeat itself; at full width it rarely does)."""
    prompts = [[3 + (i * 7 + j * j) % 50 for j in range(9 + 5 * i)] for i in range(4)]
    accepted = 0
    for batch in (prompts[:1], prompts):
        plain, none = _generate(runner, 0, batch, **sampling)
        fast, kept = _generate(runner, 4, batch, **sampling)
        assert none == 0
        assert fast == plain
        accepted += kept
    assert accepted > 0


def test_the_draft_window_shrinks_on_rejections_and_grows_back() -> None:
    assert next_window(8, 8, 8, most=8) == 8
    assert next_window(2, 2, 2, most=8) == 4  # all kept: twice as many
    assert next_window(8, 8, 0, most=8) == 1  # none kept: one
    assert next_window(8, 8, 3, most=8) == 4  # the kept ones and one more
    assert next_window(1, 1, 1, most=8) == 2


class NewEveryThirdRunner(FakeRunner):
    """A model that says 5, 6, then a token never seen before, over and over: prompt lookup
    keeps guessing the old third token after 5, 6, and is always wrong."""

    def _next(self, s: ScheduledRequest, end: int) -> int:
        return (5, 6, 100 + end)[end % 3]


def test_drafts_that_keep_failing_are_cut_to_one_a_step() -> None:
    prompt = [5, 6, 7, 5, 6, 8]
    core = FakeCore(runner=NewEveryThirdRunner(), num_speculative_tokens=8)
    core.add("r", prompt, max_tokens=60, **GREEDY)
    core.run()
    assert core.tokens["r"] == [(5, 6, 100 + p)[p % 3] for p in range(6, 66)]
    carried = [len(s.draft_token_ids) for out in core.runner.steps for s in out.scheduled]
    assert max(carried) == 8  # the window starts full
    assert core.core.scheduler.spec_accepted_total == 0
    assert sorted(set(carried[carried.index(8) + 1 :])) == [0, 1], carried
