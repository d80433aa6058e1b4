"""The engine on a real (tiny, random-weight) model, on the CPU and on CUDA: batching never
changes a request's output, aborts free everything, preemption recomputes exactly, seeds
reproduce, stop strings cut."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest
from factories import DEVICES

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.llm import LLM
from headrace.engine.messages import EngineCoreRequest
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import FinishReason, SamplingParams


@pytest.fixture(scope="module", params=DEVICES)
def runner(tiny_model_dir, request):
    from headrace.engine.runner.model_runner import ModelRunner

    return ModelRunner(
        ModelConfig(model=str(tiny_model_dir), dtype="float32", device=request.param),
        CacheConfig(block_size=16, num_kv_blocks=128),
    )


class PoolView:
    """The shared runner with a smaller KV pool as far as the scheduler knows."""

    def __init__(self, runner, num_kv_blocks: int) -> None:
        self.runner = runner
        self.num_kv_blocks = num_kv_blocks
        self.block_size = runner.block_size
        self.max_model_len = runner.max_model_len
        self.eos_token_ids = runner.eos_token_ids
        self.model_name = runner.model_name
        self.describe = runner.describe

    def execute(self, out):
        return self.runner.execute(out)


@dataclass
class Run:
    tokens: list[int]
    finish: FinishReason | None = None


def _drive(core: EngineCore, arrivals: dict[int, list[EngineCoreRequest]]) -> dict[str, Run]:
    """Step the core, adding each request at its arrival step; check blocks every step."""
    runs: dict[str, Run] = {}
    step = 0
    while core.has_work() or any(s >= step for s in arrivals):
        for r in arrivals.get(step, []):
            core.add_request(r)
            runs[r.request_id] = Run([])
        outputs, _ = core.step()
        for o in outputs:
            runs[o.request_id].tokens += o.new_token_ids
            runs[o.request_id].finish = o.finish_reason or runs[o.request_id].finish
        sched = core.scheduler
        core.block_manager.check_invariants(
            {r.request_id: r.num_computed_tokens for r in sched.running}
        )
        step += 1
    assert core.block_manager.num_used_blocks == 0
    return runs


def _alone(runner, req: EngineCoreRequest) -> Run:
    core = EngineCore(SchedulerConfig(), runner)
    return _drive(core, {0: [req]})[req.request_id]


def _mixed_requests(n: int, vocab: int, seed: int = 0) -> list[EngineCoreRequest]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.choice([1, 5, 17, 40, 90, 150]))]
        kind = i % 4
        params = SamplingParams(
            max_tokens=rng.randint(1, 24),
            temperature=0.0 if kind < 2 else 0.9,
            top_p=1.0 if kind != 2 else 0.8,
            top_k=0 if kind != 3 else 20,
            seed=None if kind < 2 else 1000 + i,
            ignore_eos=kind == 1,
        )
        reqs.append(EngineCoreRequest(f"r{i}", prompt, params))
    return reqs


def test_32_staggered_requests_each_equal_their_solo_run(runner):
    reqs = _mixed_requests(32, runner.vocab_size)
    rng = random.Random(1)
    arrivals: dict[int, list[EngineCoreRequest]] = {}
    for r in reqs:
        arrivals.setdefault(rng.randrange(0, 40), []).append(r)
    sched = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16)
    runs = _drive(EngineCore(sched, runner), arrivals)
    for r in reqs:
        alone = _alone(runner, r)
        assert runs[r.request_id].tokens == alone.tokens, r.request_id
        assert runs[r.request_id].finish == alone.finish
    assert {runs[r.request_id].finish for r in reqs} >= {FinishReason.LENGTH}


def test_a_kv_pool_too_small_preempts_and_outputs_stay_the_same(runner):
    reqs = [
        EngineCoreRequest(f"p{i}", [5 + i] * 20, SamplingParams(40, temperature=0, ignore_eos=True))
        for i in range(6)
    ]
    # 8 blocks of 16 = 128 tokens for six requests of 60 tokens each.
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=64), PoolView(runner, 8))
    preempted_mid_decode = set()
    add = core.scheduler.queue.add

    def watch(req):  # every preemption goes through the queue
        if req.num_output_tokens:
            preempted_mid_decode.add(req.request_id)
        add(req)

    core.scheduler.queue.add = watch  # type: ignore[method-assign]
    runs = _drive(core, {0: reqs})
    assert len(preempted_mid_decode) >= 2
    for r in reqs:
        assert runs[r.request_id].tokens == _alone(runner, r).tokens
        assert runs[r.request_id].finish is FinishReason.LENGTH


def test_aborts_in_every_phase_free_all_blocks_and_ids_are_reusable(runner):
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=2), runner)
    long = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    core.add_request(EngineCoreRequest("decode", [7] * 10, long))
    core.add_request(EngineCoreRequest("prefill", [8] * 100, long))
    core.add_request(EngineCoreRequest("queued", [9] * 10, long))
    core.step()
    core.step()
    assert 0 < core.scheduler.requests["prefill"].num_computed_tokens < 100
    assert core.scheduler.requests["decode"].num_output_tokens == 2
    finished = {}
    for rid in ("decode", "prefill", "queued"):
        assert core.abort_request(rid)
    outputs, stats = core.step()
    finished.update({o.request_id: o.finish_reason for o in outputs})
    assert finished == dict.fromkeys(("decode", "prefill", "queued"), FinishReason.ABORT)
    assert stats.kv_blocks_used == 0 and not core.has_work()

    # During the final step: the abort lands while the model computes the last token.
    short = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    core.add_request(EngineCoreRequest("decode", [7] * 10, short))
    core.step()
    core.step()
    execute = runner.execute
    try:
        runner.execute = lambda out: (core.abort_request("decode"), execute(out))[1]
        outputs, stats = core.step()
    finally:
        del runner.execute
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs] == [
        ("decode", [], FinishReason.ABORT)
    ]
    assert stats.kv_blocks_used == 0
    core.step()  # deliver nothing more for the aborted request
    again = EngineCoreRequest("decode", [7] * 10, short)  # the id is free again
    assert _drive(core, {0: [again]})["decode"] == _alone(runner, again)


def test_seeded_sampling_reproduces_and_stop_strings_cut_exactly(runner):
    llm = LLM(runner=runner, tokenizer=load_tokenizer(runner.model_dir))
    prompt = "The quick brown fox"
    sampled = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    a = llm.generate([prompt, "Hello world"], [sampled, sampled])
    b = llm.generate(prompt, sampled)
    assert a[0].token_ids == b[0].token_ids
    other = llm.generate(prompt, SamplingParams(24, temperature=1.0, seed=8, ignore_eos=True))
    assert other[0].token_ids != a[0].token_ids

    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    text = llm.generate(prompt, greedy)[0].text
    stop = next(
        text[i : i + 3]
        for i in range(len(text) // 3, len(text))
        if "\ufffd" not in text[i : i + 3] and text[i : i + 3].strip()
    )
    streamed: list[str] = []
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=(stop,))
    [out] = llm.generate(prompt, params, on_chunk=lambda c: streamed.append(c.text))
    assert out.finish_reason is FinishReason.STOP
    assert out.text == text[: text.index(stop)]
    assert "".join(streamed) == out.text
    assert llm.core.block_manager.num_used_blocks == 0


def test_a_seeded_continuation_with_its_seed_offset_draws_the_rest_of_the_stream(runner):
    """What the router does after a replica died mid-stream: prompt plus the tokens sent,
    `seed_offset` moved on by them, gives the tokens the whole request would have given."""
    llm = LLM(runner=runner, tokenizer=load_tokenizer(runner.model_dir))
    sampled = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)
    whole = llm.generate("The quick brown fox", sampled)[0]
    k = 8
    rest = dataclasses.replace(sampled, max_tokens=20 - k, seed_offset=k)
    [cont] = llm.generate([whole.prompt_token_ids + whole.token_ids[:k]], rest)
    assert cont.token_ids == whole.token_ids[k:]
    unshifted = dataclasses.replace(rest, seed_offset=0)
    [wrong] = llm.generate([whole.prompt_token_ids + whole.token_ids[:k]], unshifted)
    assert wrong.token_ids != whole.token_ids[k:]


def test_the_runner_lets_go_of_finished_requests_table_rows(runner):
    core = EngineCore(SchedulerConfig(), runner)
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = [EngineCoreRequest(f"rows-{i}", [5 + i] * (10 + 7 * i), greedy) for i in range(3)]
    _drive(core, {0: first})
    later = EngineCoreRequest("rows-later", [9] * 12, greedy)
    _drive(core, {0: [later]})  # its first step tells the runner the first three finished
    assert not any(r.request_id in runner.block_rows for r in first)
    assert later.request_id in runner.block_rows  # until the core's next step


def test_overlapped_steps_equal_their_solo_runs(runner):
    """--async-scheduling on the real runner: the next step's decodes take their tokens from
    the step launched before, on the device, and every request gets its solo tokens."""
    reqs = _mixed_requests(24, runner.vocab_size, seed=5)
    rng = random.Random(2)
    arrivals: dict[int, list[EngineCoreRequest]] = {}
    for r in reqs:
        arrivals.setdefault(rng.randrange(0, 30), []).append(r)
    sched = SchedulerConfig(
        max_num_batched_tokens=64, max_num_seqs=16, num_speculative_tokens=0, async_scheduling=True
    )
    filled: list[int] = []
    fill = runner.last_tokens.fill
    runner.last_tokens.fill = lambda ids, pending: (filled.append(len(pending)), fill(ids, pending))
    try:
        runs = _drive(EngineCore(sched, runner), arrivals)
    finally:
        del runner.last_tokens.fill
    assert sum(filled) > 100  # most decodes: the token of a step not yet read
    for r in reqs:
        alone = _alone(runner, r)
        assert runs[r.request_id].tokens == alone.tokens, r.request_id
        assert runs[r.request_id].finish == alone.finish


def test_overlapped_steps_mixed_with_penalties_and_logprobs_equal_their_solo_runs(runner):
    """Rows with penalties and bad words (their history's last token taken on the device
    from the step in flight) and logprobs overlap with plain ones: every request still
    equals its solo run."""
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    mixed = [
        EngineCoreRequest(f"m{i}", [3 + i, 9, 4 + 2 * i, 7] * (i + 1), params)
        for i, params in enumerate(
            [dataclasses.replace(greedy, max_tokens=30)] * 5
            + [
                dataclasses.replace(greedy, repetition_penalty=1.3),
                dataclasses.replace(greedy, logprobs=2, max_tokens=5),
                dataclasses.replace(greedy, temperature=0.8, seed=3, presence_penalty=0.5),
                dataclasses.replace(greedy, frequency_penalty=0.7, bad_words=((5,), (9, 4))),
            ]
        )
    ]
    sched = SchedulerConfig(num_speculative_tokens=0, async_scheduling=True)
    core = EngineCore(sched, runner)
    runs = _drive(core, {0: mixed[:5], 3: mixed[5:6], 9: mixed[6:]})
    assert core.last_stats.steps_overlapped_total > 8  # before the others come, and after
    for r in mixed:
        assert runs[r.request_id].tokens == _alone(runner, r).tokens, r.request_id
