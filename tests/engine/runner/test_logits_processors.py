"""Logits processors on synthetic logits: each formula of docs/api.md against a direct
computation, per request inside one batch; the scheduler sends history only where needed."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from engine.logits_reference import reference

from headrace.engine.logits_inputs import logits_inputs
from headrace.engine.outputs import LogitsInputs, ScheduledRequest
from headrace.engine.runner.logits_processors import apply_processors, bad_word_bans
from headrace.engine.runner.sampler import Sampler
from headrace.request import PENDING_TOKEN, Request, SamplingParams

VOCAB = 64
EOS = 3


def scheduled(
    rid: str, p: SamplingParams, prompt: list[int], output: list[int]
) -> ScheduledRequest:
    """The ScheduledRequest the scheduler sends for the next token of this request."""
    req = Request(rid, list(prompt), p, eos_token_ids=(EOS,), output_token_ids=list(output))
    return ScheduledRequest(rid, [1], 0, [0], True, p, len(output), logits_inputs(req))


def raw_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


PROMPT = [5, 6, 7, 5, 9, 10]
OUTPUT = [11, 5, 11, 12, 11, 40]
CASES = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.7),
    SamplingParams(frequency_penalty=0.8),
    SamplingParams(presence_penalty=-1.5),
    SamplingParams(frequency_penalty=-0.4, presence_penalty=1.1),
    SamplingParams(logit_bias=((5, -100.0), (11, 3.5), (63, 100.0))),
    SamplingParams(max_tokens=20, min_tokens=10, stop_token_ids=(8,)),
    SamplingParams(max_tokens=20, min_tokens=10, ignore_eos=True, stop_token_ids=(8,)),
    SamplingParams(bad_words=((13,), (12, 11, 40, 2), (11, 40, 4), (40, 17), (5, 18))),
    SamplingParams(
        repetition_penalty=1.5,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        logit_bias=((11, 2.0), (3, 5.0)),
        max_tokens=30,
        min_tokens=7,
        bad_words=((40, 21),),
    ),  # fmt: skip
]


@pytest.mark.parametrize("params", CASES, ids=lambda p: repr(p)[15:60])
def test_each_processor_follows_its_formula(params: SamplingParams) -> None:
    raw = raw_logits(1, seed=3)
    req = scheduled("r", params, PROMPT, OUTPUT)
    got = apply_processors(raw.clone(), [req])[0]
    torch.testing.assert_close(
        got, reference(raw[0], params, PROMPT, OUTPUT, (EOS,)), rtol=0, atol=1e-6
    )


def test_one_batch_applies_each_request_its_own_settings() -> None:
    raw = raw_logits(len(CASES), seed=4)
    reqs = [scheduled(str(i), p, PROMPT, OUTPUT[: 2 + i % 5]) for i, p in enumerate(CASES)]
    got = apply_processors(raw.clone(), reqs)
    for i, p in enumerate(CASES):
        want = reference(raw[i], p, PROMPT, OUTPUT[: 2 + i % 5], (EOS,))
        torch.testing.assert_close(got[i], want, rtol=0, atol=1e-6)


def test_bad_words_ban_the_last_token_after_the_rest() -> None:
    words = ((7,), (1, 2), (9, 1, 2, 3))
    assert bad_word_bans([], words) == [7]
    assert bad_word_bans([4, 1], words) == [7, 2]
    assert bad_word_bans([9, 1, 2], words) == [7, 3]
    assert bad_word_bans([1, 2, 1], words) == [7, 2]


def test_plain_requests_carry_no_history() -> None:
    assert scheduled("a", SamplingParams(), PROMPT, OUTPUT).logits_inputs is None
    assert scheduled("b", SamplingParams(min_p=0.2, top_k=3), PROMPT, OUTPUT).logits_inputs is None
    bias = scheduled("c", SamplingParams(logit_bias=((1, 1.0),)), PROMPT, OUTPUT).logits_inputs
    assert bias == LogitsInputs([], [], ())
    freq = scheduled("d", SamplingParams(frequency_penalty=1), PROMPT, OUTPUT).logits_inputs
    assert freq == LogitsInputs(OUTPUT, [], ())
    rep = scheduled("e", SamplingParams(repetition_penalty=1.1), PROMPT, OUTPUT).logits_inputs
    assert rep == LogitsInputs(OUTPUT, PROMPT, ())


def test_min_tokens_bans_eos_and_stop_ids_only_until_reached() -> None:
    p = SamplingParams(max_tokens=10, min_tokens=3, stop_token_ids=(8, EOS))
    assert scheduled("a", p, PROMPT, [1, 2]).logits_inputs == LogitsInputs([], [], (EOS, 8))
    assert scheduled("a", p, PROMPT, [1, 2, 4]).logits_inputs is None  # reached: plain path
    quiet = SamplingParams(max_tokens=10, min_tokens=3, ignore_eos=True)
    assert scheduled("b", quiet, PROMPT, []).logits_inputs is None  # nothing to ban


def test_greedy_with_penalties_takes_the_argmax_of_the_processed_logits() -> None:
    raw = raw_logits(6, seed=5)
    top = raw.argmax(-1).tolist()
    reqs = [
        scheduled(str(i), SamplingParams(temperature=0, frequency_penalty=2.0), [], [top[i]] * 3)
        for i in range(6)
    ]
    tokens, _ = Sampler()(raw.clone(), reqs)
    want = [
        int(reference(raw[i], reqs[i].params, [], [top[i]] * 3, (EOS,)).argmax()) for i in range(6)
    ]
    assert tokens == want and all(t != top[i] for i, t in enumerate(tokens))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_neighbours_are_unchanged(dtype: torch.dtype) -> None:
    raw = raw_logits(8, seed=6).to(dtype)
    plain = [
        scheduled("g", SamplingParams(temperature=0), [], []),
        scheduled("s", SamplingParams(seed=11, top_k=5), [], [1, 2]),
        scheduled("u", SamplingParams(seed=12, top_p=0.8), [], [3]),
    ]
    alone, lp_alone = Sampler()(raw[:3].clone(), plain)
    extra = [
        scheduled("p1", SamplingParams(temperature=0, logit_bias=((0, 100.0),)), [], []),
        scheduled("p2", SamplingParams(seed=3, presence_penalty=2.0), [], [4, 4]),
    ]
    rows = torch.cat([raw[:1], raw[6:7], raw[1:3], raw[7:8]])
    mixed, _ = Sampler()(rows.clone(), [plain[0], extra[0], plain[1], plain[2], extra[1]])
    assert [mixed[0], mixed[2], mixed[3]] == alone
    assert mixed[1] == 0  # forced by +100


def test_logit_bias_bans_and_forces_draws() -> None:
    raw = raw_logits(1, seed=7)
    top = int(raw.argmax())
    ban = SamplingParams(seed=1, logit_bias=((top, -100.0),))
    force = SamplingParams(seed=1, temperature=2.0, logit_bias=((17, 100.0),))
    for step in range(50):
        req_ban = scheduled("b", ban, [], [0] * step)
        assert Sampler()(raw.clone(), [req_ban])[0] != [top]
        assert Sampler()(raw.clone(), [scheduled("f", force, [], [0] * step)])[0] == [17]


def test_min_p_keeps_tokens_within_its_share_of_the_top() -> None:
    logits = torch.full((VOCAB,), -1e9)
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    logits[:5] = probs.log()
    sampler = Sampler(seed=0)
    req = scheduled("m", SamplingParams(min_p=0.3), [], [])
    drawn = Counter(sampler(logits[None].clone(), [req])[0][0] for _ in range(400))
    assert set(drawn) == {0, 1, 2}  # p >= 0.3 * 0.4 = 0.12
    assert Sampler()(logits[None], [scheduled("m", SamplingParams(min_p=1.0), [], [])])[0] == [0]


def test_out_of_vocabulary_ids_are_skipped() -> None:
    raw = raw_logits(1, seed=8)
    p = SamplingParams(logit_bias=((VOCAB + 5, 100.0),), bad_words=((VOCAB,),))
    got = apply_processors(raw.clone(), [scheduled("o", p, [], [VOCAB + 1])])
    torch.testing.assert_close(got, raw)


@pytest.mark.parametrize("flying", [40, 11, 12, 7])
def test_bad_words_after_a_placeholder_ban_as_after_its_token(flying: int) -> None:
    """A history whose last token is still in flight (--async-scheduling): each bad word whose
    other tokens end the output with that token is banned on the device, as with the token
    known; words ending the known part but not that token are not."""
    words = ((13,), (12, 11, 40, 2), (11, 40, 4), (40, 17), (11, 9), (5, 18), (12, 11, 19))
    params = SamplingParams(bad_words=words, presence_penalty=0.5)
    raw = raw_logits(2, seed=8)
    known = [scheduled("k", params, PROMPT, [*OUTPUT[:4], 11, flying])]
    pending = [scheduled("p", params, PROMPT, [*OUTPUT[:4], 11, PENDING_TOKEN])]
    want = apply_processors(raw[:1].clone(), known)
    got = apply_processors(raw[:1].clone(), pending, torch.tensor([flying]))
    assert torch.equal(got, want)
    raw[0, 17] = float("inf")  # an overflowed logit a word bans: -inf, not NaN
    both = apply_processors(raw[:1].clone(), pending, torch.tensor([40]))[0, 17]
    assert both == float("-inf")
    with pytest.raises(ValueError, match="pending token"):
        apply_processors(raw[:1].clone(), [scheduled("q", SamplingParams(bad_words=words),
                                                     PROMPT, [11, PENDING_TOKEN])])  # fmt: skip
