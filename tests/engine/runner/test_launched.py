"""A launched step's picks (runner/launched.py): read by request with the logprobs its rows
asked for, and kept where the next step's placeholders find them; a placeholder no launched
step answers is refused by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from factories import DEVICES

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.messages import EngineCoreRequest, RequestOutput, TokenLogprobs
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.launched import LastTokens, Launched
from headrace.engine.runner.logprobs import logprob_table
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.request import PENDING_TOKEN, SamplingParams

P = SamplingParams()


@pytest.mark.parametrize("device", DEVICES)
def test_picks_on_the_device_are_read_by_request(device: str) -> None:
    tokens = torch.tensor([7, 3, 9], device=device)
    launched = Launched.on_device(["a", "b", "c"], tokens)
    assert (launched.host is not None) == (device == "cuda")  # a copy queued, pinned
    result = launched.read()
    assert result.sampled == {"a": 7, "b": 3, "c": 9}
    assert Launched(result=result).read() is result  # picks the host made: as they are


@pytest.mark.parametrize("device", DEVICES)
def test_placeholders_take_the_kept_picks_of_their_requests(device: str) -> None:
    dev = torch.device(device)
    steps = [
        ScheduledRequest("x", [4], 8, [0, 1, 7], True, P, 1),
        ScheduledRequest("b", [PENDING_TOKEN], 5, [2, 3], True, P, 1),
        ScheduledRequest("c", [1, 2, 3], 0, [4], True, P, 0),
        ScheduledRequest("a", [PENDING_TOKEN], 6, [5, 6], True, P, 2),
    ]
    inputs = build_step_inputs(steps, 4, [None], dev)
    assert inputs.pending == [(1, "b"), (2, "a")]  # decodes first: x, b, a, then the chunk
    last = LastTokens()
    assert not last.held
    with pytest.raises(ValueError, match="request b: a pending token no launched step samples"):
        last.fill(inputs.input_ids, inputs.pending)
    last.keep(["a", "z", "b"], torch.tensor([11, 12, 13], device=dev))
    last.fill(inputs.input_ids, inputs.pending)
    assert inputs.input_ids.tolist() == [4, 13, 11, 1, 2, 3]
    last.keep(["z"], torch.tensor([5], device=dev))
    with pytest.raises(ValueError, match="request b: a pending token"):
        last.fill(inputs.input_ids, inputs.pending)
    last.clear()
    assert not last.held and build_step_inputs(steps[:1], 4, [None], dev).pending == []


@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_come_with_the_tokens_by_request(device: str) -> None:
    """A launched step's logprob table (the chosen token's, then the N best) is read with its
    tokens, by request, each with as many alternatives as it asked for."""
    logits = torch.log_softmax(torch.randn(3, 11, generator=torch.Generator().manual_seed(0)), -1)
    logits = logits.to(device)
    rows = [
        ScheduledRequest("a", [1], 0, [0], True, SamplingParams(logprobs=2), 0),
        ScheduledRequest("b", [1], 0, [0], True, P, 0),
        ScheduledRequest("c", [1], 0, [0], True, SamplingParams(logprobs=0), 0),
    ]
    tokens = torch.tensor([4, 7, 9], device=device)
    table = logprob_table(logits, rows, tokens)
    result = Launched.on_device(["a", "b", "c"], tokens, table).read()
    assert result.sampled == {"a": 4, "b": 7, "c": 9} and set(result.logprobs) == {"a", "c"}
    lp = logits.cpu().double()
    a, c = result.logprobs["a"], result.logprobs["c"]
    assert a.token_id == 4 and a.logprob == pytest.approx(float(lp[0, 4]), abs=1e-6)
    best = lp[0].topk(2)
    assert [t for t, _ in a.top] == best.indices.tolist()
    assert [v for _, v in a.top] == pytest.approx(best.values.tolist(), abs=1e-6)
    assert c.token_id == 9 and c.top == [] and c.logprob == pytest.approx(float(lp[2, 9]), 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_overlapped_steps_with_logprobs_and_biases_report_the_serial_ones(
    tiny_model_dir: Path, device: str
) -> None:
    """On a real model, requests with logprobs (greedy and seeded draws), logit_bias,
    min_tokens and penalties beside plain ones: with --async-scheduling their steps overlap,
    and each gets the tokens and logprobs it gets with steps in series."""
    config = ModelConfig(model=str(tiny_model_dir), dtype="float32", device=device)
    runner = ModelRunner(config, CacheConfig(block_size=16, num_kv_blocks=128))
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    kinds = [
        greedy,
        dataclasses.replace(greedy, logprobs=2),
        dataclasses.replace(greedy, temperature=0.8, seed=7, logprobs=3),
        dataclasses.replace(greedy, temperature=1.0, top_p=0.9, seed=8, logprobs=1),
        dataclasses.replace(greedy, logit_bias=((5, 4.0), (6, -100.0)), logprobs=1),
        dataclasses.replace(greedy, ignore_eos=False, min_tokens=9, temperature=0.7, seed=2),
        dataclasses.replace(greedy, frequency_penalty=0.9, presence_penalty=0.4, logprobs=2),
        dataclasses.replace(greedy, repetition_penalty=1.6, temperature=0.9, seed=4),
    ]
    reqs = [EngineCoreRequest(f"r{i}", [3 + i, 9, 4, 7] * (i + 1), kinds[i % 8]) for i in range(9)]
    runs, overlapped = {}, {}
    for overlap in (False, True):
        sched = SchedulerConfig(num_speculative_tokens=0, async_scheduling=overlap)
        core = EngineCore(sched, runner)
        for r in reqs:
            core.add_request(r)
        outputs: dict[str, list[RequestOutput]] = {r.request_id: [] for r in reqs}
        while core.has_work():
            for o in core.step()[0]:
                outputs[o.request_id].append(o)
        runs[overlap], overlapped[overlap] = outputs, core.last_stats.steps_overlapped_total
    assert overlapped[False] == 0 and overlapped[True] >= 8
    for r in reqs:
        serial, flown = runs[False][r.request_id], runs[True][r.request_id]
        assert _tokens(flown) == _tokens(serial)
        assert len(_tokens(serial)) == 12 or len(_tokens(serial)) >= 9 and not r.params.ignore_eos
        got, want = _logprobs(flown), _logprobs(serial)
        asked = r.params.logprobs is not None
        assert len(got) == (len(_tokens(serial)) if asked else 0) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.token_id == w.token_id and [t for t, _ in g.top] == [t for t, _ in w.top]
            assert g.logprob == pytest.approx(w.logprob, abs=1e-4)
            assert [v for _, v in g.top] == pytest.approx([v for _, v in w.top], abs=1e-4)


def _tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def _logprobs(outputs: list[RequestOutput]) -> list[TokenLogprobs]:
    return [lp for o in outputs for lp in o.logprobs]
