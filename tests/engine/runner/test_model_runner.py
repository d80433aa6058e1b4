"""ModelRunner on tiny random models: ragged batches equal one-at-a-time, the runner's
interface, sampling settings and logprobs through `execute`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from factories import VOCAB, make_tiny

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.outputs import ScheduledRequest, SchedulerOutput
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import RunnerHarness, greedy
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import SamplingParams

PROMPT_LENGTHS = [1, 2, 7, 16, 17, 33, 50, 64]
CHUNKS = [None, 1, 3, 4, 5, 7, 16, 13]
NEW_TOKENS = 12


@pytest.fixture(scope="module", params=["gemma3", "qwen2"])
def runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    path = tmp_path_factory.mktemp(request.param)
    make_tiny(request.param, path)
    return ModelRunner(
        ModelConfig(model=str(path), dtype="float32", device="cpu"),
        CacheConfig(block_size=4, num_kv_blocks=400),
    )


def test_the_context_is_no_longer_than_the_kv_pool(
    runner: ModelRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """A pool of 20 blocks of 4 holds 80 tokens: the runner serves a context of 80, says so
    in the log, and takes a request of 80 tokens; a pool that holds the model's 512 changes
    nothing."""
    small = ModelRunner.from_parts(
        runner.model, runner.model_dir, CacheConfig(block_size=4, num_kv_blocks=20), 512
    )
    assert small.max_model_len == 80
    assert "the KV pool holds 80 tokens, fewer than max_model_len 512" in caplog.text
    out = greedy(small, [_prompts()[6][:40]], 40)[0]  # 40 + 40 = the whole pool
    assert len(out) == 40
    whole = ModelRunner.from_parts(
        runner.model, runner.model_dir, CacheConfig(block_size=4, num_kv_blocks=128), 512
    )
    assert whole.max_model_len == 512


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def test_ragged_batch_equals_one_at_a_time(runner: ModelRunner) -> None:
    prompts = _prompts()
    alone = [greedy(runner, [p], NEW_TOKENS)[0] for p in prompts]
    harness = RunnerHarness(runner)
    for i, (p, chunk) in enumerate(zip(prompts, CHUNKS, strict=True)):
        harness.add(str(i), p, NEW_TOKENS, chunk=chunk)
    # Staggered arrivals: sequence i joins at step 2 * i, so chunked prefills of newcomers
    # share steps with the decodes of those already running.
    step = 0
    while any(not s.done for s in harness.seqs.values()):
        harness.step(only=[str(i) for i in range(len(prompts)) if 2 * i <= step])
        step += 1
    assert [harness.seqs[str(i)].output for i in range(len(prompts))] == alone


def test_runner_interface(runner: ModelRunner) -> None:
    assert runner.block_size == 4 and runner.num_kv_blocks == 400
    assert runner.max_model_len == 512
    assert runner.vocab_size == VOCAB
    assert 2 in runner.eos_token_ids
    assert runner.model_name.startswith(("gemma3", "qwen2"))
    assert load_tokenizer(runner.model_dir).encode("w5 w6") == [5, 6]  # tokenizer.json adds no BOS
    assert runner.execute(SchedulerOutput([])).sampled == {}


def test_no_sample_for_partial_chunks_and_logprobs(runner: ModelRunner) -> None:
    params = SamplingParams(temperature=0.0, logprobs=3)
    first = ScheduledRequest("a", [5, 6, 7], 0, [0], False, params, 0)
    assert runner.execute(SchedulerOutput([first])).sampled == {}
    rest = ScheduledRequest("a", [8, 9], 3, [0, 1], True, params, 0)
    out = runner.execute(SchedulerOutput([rest]))
    token = out.sampled["a"]
    lp = out.logprobs["a"]
    assert lp.token_id == token and lp.logprob <= 0
    assert [t for t, _ in lp.top][0] == token  # greedy picks the most likely token
    values = [v for _, v in lp.top]
    assert values == sorted(values, reverse=True) and len(values) == 3


def test_seeded_sampling_ignores_batch_composition(runner: ModelRunner) -> None:
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=8)
    prompt = _prompts()[3]

    def sample(with_others: bool) -> list[int]:
        harness = RunnerHarness(runner)
        harness.add("s", prompt, 8, params=seeded)
        if with_others:
            harness.add("x", _prompts()[5], 8, params=SamplingParams(temperature=0.7))
            harness.add("y", _prompts()[1], 8)
        return harness.run()["s"]

    assert sample(False) == sample(True)


def test_bad_step_inputs_are_refused(runner: ModelRunner) -> None:
    params = SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="block id"):
        runner.execute(SchedulerOutput([ScheduledRequest("a", [5], 0, [9999], True, params, 0)]))
    with pytest.raises(ValueError, match="token id"):
        runner.execute(SchedulerOutput([ScheduledRequest("a", [VOCAB], 0, [0], True, params, 0)]))
    with pytest.raises(ValueError, match="blocks cannot hold"):
        runner.execute(SchedulerOutput([ScheduledRequest("a", [5] * 5, 0, [0], True, params, 0)]))


def test_model_path_that_does_not_exist(tmp_path: Path) -> None:
    from headrace.loader.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no such"):
        ModelRunner(ModelConfig(model=str(tmp_path / "nope")), CacheConfig())


@pytest.mark.parametrize(
    ("flags", "device", "expected"),
    [
        ("fpu avx512f avx512_bf16 avx512_vnni", "cpu", torch.bfloat16),
        ("fpu amx_bf16 amx_tile", "cpu", torch.bfloat16),
        ("fpu avx2 avx512f", "cpu", torch.float32),
        ("fpu avx2", "cuda", torch.bfloat16),
    ],
)
def test_auto_dtype_is_bf16_only_where_it_is_native(
    tmp_path: Path, flags: str, device: str, expected: torch.dtype
) -> None:
    from headrace.engine.runner.precision import pick_dtype

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert pick_dtype("auto", torch.device(device), cpuinfo) == expected
    assert pick_dtype("float32", torch.device(device), cpuinfo) == torch.float32


def test_a_refused_step_still_lets_go_of_the_finished_requests(runner: ModelRunner) -> None:
    params = SamplingParams(temperature=0.0)
    runner.execute(
        SchedulerOutput([ScheduledRequest("gone", [5], 0, [0], True, params, 0, table_epoch=1)])
    )
    assert "gone" in runner.block_rows
    bad = SchedulerOutput([ScheduledRequest("x", [VOCAB], 0, [1], True, params, 0)], ["gone"])
    with pytest.raises(ValueError, match="token id"):
        runner.execute(bad)
    assert "gone" not in runner.block_rows
