"""Logits processors on a real (tiny, random-weight) model through the LLM class: the processed
logits follow docs/api.md's formulas, logit_bias bans and forces, min_tokens keeps EOS away,
bad words never appear, and plain neighbours in the same steps are unchanged."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from engine.logits_reference import reference

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.llm import LLM, CompletionOutput
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner import sampler as sampler_module
from headrace.engine.runner.model_runner import ModelRunner
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import FinishReason, SamplingParams

PROMPTS = ["The quick brown fox", "Hello world, this", "numbers 12345 and", "Stop strings"]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=str(tiny_model_dir), dtype="float32", device="cpu"),
        CacheConfig(block_size=16, num_kv_blocks=128),
    )


@pytest.fixture
def llm(runner: ModelRunner) -> LLM:
    return LLM(runner=runner, tokenizer=load_tokenizer(runner.model_dir))


@dataclass
class Processed:
    raw: torch.Tensor  # [V]
    out: torch.Tensor  # [V]
    req: ScheduledRequest


def test_processed_logits_follow_the_formulas(
    llm: LLM, runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Processed] = []

    def recording(
        logits: torch.Tensor, reqs: list[ScheduledRequest], last: torch.Tensor | None = None
    ) -> torch.Tensor:
        raw = logits.clone()
        out = sampler_module.apply_processors.__wrapped__(logits, reqs, last)  # type: ignore[attr-defined]
        seen.extend(Processed(raw[i], out[i].clone(), r) for i, r in enumerate(reqs))
        return out

    recording.__wrapped__ = sampler_module.apply_processors  # type: ignore[attr-defined]
    monkeypatch.setattr(sampler_module, "apply_processors", recording)
    params = [
        replace(GREEDY, repetition_penalty=1.8),
        replace(GREEDY, frequency_penalty=1.5, presence_penalty=0.5),
        replace(GREEDY, temperature=0.8, seed=5, presence_penalty=-1.0, logit_bias=((7, 3.0),)),
        replace(GREEDY, ignore_eos=False, min_tokens=6, logit_bias=((2, 8.0),), bad_words=((9,),)),
    ]
    outs = llm.generate(PROMPTS, params)
    by_id = {o.request_id: o for o in outs}
    eos = runner.eos_token_ids
    assert len(seen) == sum(len(o.token_ids) for o in outs)  # every step of every request
    for s in seen:
        o = by_id[s.req.request_id]
        k = s.req.num_output_tokens
        want = reference(s.raw, s.req.params, o.prompt_token_ids, o.token_ids[:k], eos)
        torch.testing.assert_close(s.out, want, rtol=0, atol=1e-5)
        if s.req.params.greedy:
            assert o.token_ids[k] == int(s.out.argmax())
    assert len(by_id["llm-4"].token_ids) >= 6 and 9 not in by_id["llm-4"].token_ids


def _generate(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_logit_bias_bans_and_forces(llm: LLM) -> None:
    free = _generate(llm, PROMPTS[:1], [GREEDY])[0]
    banned = replace(GREEDY, logit_bias=((free[0], -100.0),))
    assert _generate(llm, PROMPTS[:1], [banned])[0][0] != free[0]
    token = next(t for t in range(10, 500) if t not in free)
    for p in (GREEDY, replace(GREEDY, temperature=1.0, seed=3), replace(GREEDY, temperature=1.5)):
        forced = replace(p, logit_bias=((token, 100.0),))
        assert _generate(llm, PROMPTS[:1], [forced])[0] == [token] * GREEDY.max_tokens


def test_min_tokens_keeps_eos_away(llm: LLM, runner: ModelRunner) -> None:
    eos = runner.eos_token_ids[0]
    eager = SamplingParams(max_tokens=12, temperature=0.0, logit_bias=((eos, 100.0),))
    first: CompletionOutput = llm.generate(PROMPTS[0], eager)[0]
    assert first.token_ids == [eos] and first.finish_reason == FinishReason.STOP
    for min_tokens in (1, 5):
        held = llm.generate(PROMPTS[0], replace(eager, min_tokens=min_tokens))[0]
        assert len(held.token_ids) == min_tokens + 1 and held.token_ids[-1] == eos
        assert eos not in held.token_ids[:-1] and held.finish_reason == FinishReason.STOP
    stop_id = next(t for t in range(10, 500) if t != eos)
    by_stop = replace(eager, logit_bias=((stop_id, 100.0),), stop_token_ids=(stop_id,))
    held = llm.generate(PROMPTS[0], replace(by_stop, min_tokens=3))[0]
    assert held.token_ids[-1] == stop_id and len(held.token_ids) == 4


def test_bad_words_never_appear(llm: LLM) -> None:
    free = _generate(llm, PROMPTS, [GREEDY] * len(PROMPTS))
    for f, prompt in zip(free, PROMPTS, strict=True):
        pair, single = (f[2], f[3]), f[6]
        out = _generate(llm, [prompt], [replace(GREEDY, bad_words=(pair, (single,)))])[0]
        assert single not in out
        assert all((a, b) != pair for a, b in zip(out, out[1:], strict=False))
        assert out != f


def test_plain_neighbours_keep_their_greedy_outputs(llm: LLM) -> None:
    alone = _generate(llm, PROMPTS, [GREEDY] * len(PROMPTS))
    noisy = [
        replace(GREEDY, repetition_penalty=1.3, frequency_penalty=2.0, bad_words=((5, 6),)),
        replace(GREEDY, temperature=1.0, seed=1, presence_penalty=2.0, min_p=0.1),
        replace(GREEDY, logit_bias=((alone[0][0], -100.0), (11, 5.0)), min_tokens=4),
    ]
    prompts = [p for pair in zip(PROMPTS, PROMPTS[::-1], strict=True) for p in pair][:7]
    params = [GREEDY if i % 2 == 0 else noisy[i // 2 % 3] for i in range(7)]
    mixed = _generate(llm, prompts, params)
    assert [mixed[i] for i in range(0, 7, 2)] == alone
    assert mixed[1] != alone[-1]  # the penalised neighbours did change


class _WrongHead:
    """An int8 head stand-in that answers token 7 for every row: shows which steps used it."""

    max_rows = 64

    def argmax(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.full((rows.shape[0],), 7, dtype=torch.int64)


def test_processed_requests_skip_the_int8_greedy_head(
    llm: LLM, runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    done: Future[object] = Future()
    done.set_result(_WrongHead())
    monkeypatch.setattr(runner, "_greedy_head", done)
    alone = _generate(llm, PROMPTS[:1], [GREEDY])[0]
    assert alone == [7] * GREEDY.max_tokens  # plain greedy steps take the head
    plain, biased = _generate(
        llm, PROMPTS[:2], [GREEDY, replace(GREEDY, logit_bias=((7, -100.0),))]
    )
    assert plain == [7] * GREEDY.max_tokens  # a plain neighbour still does: its own pick
    assert 7 not in biased  # the processed request takes the full logits
