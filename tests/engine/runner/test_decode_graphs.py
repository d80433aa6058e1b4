"""Decode steps through `DecodeGraphs`: padded to a bucket, read from fixed buffers; on the CPU
run eagerly over those buffers (what a CUDA graph replays), on CUDA captured where present."""

from __future__ import annotations

import pytest
import torch
from factories import VOCAB, make_tiny

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner import decode_graphs
from headrace.engine.runner.decode_graphs import DecodeGraphs
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import RunnerHarness, greedy
from headrace.engine.runner.step_inputs import StepInputs, build_step_inputs

CACHE = CacheConfig(block_size=4, num_kv_blocks=200)
LENGTHS = [1, 2, 7, 16, 17, 33, 50]
NEW_TOKENS = 10


@pytest.fixture(scope="module", params=["gemma3", "qwen2"])
def runners(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelRunner, ModelRunner]:
    """(eager, buffered) over one model: gemma3's tiny config has sliding-window layers."""
    path = tmp_path_factory.mktemp(request.param)
    make_tiny(request.param, path)
    eager = ModelRunner(ModelConfig(model=str(path), dtype="float32", device="cpu"), CACHE)
    buffered = ModelRunner.from_parts(eager.model, eager.model_dir, CACHE, graphs=True)
    return eager, buffered


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in LENGTHS]


def test_only_asked_for_or_on_cuda(runners: tuple[ModelRunner, ModelRunner]) -> None:
    eager, buffered = runners
    assert eager.decode_graphs is None and eager.kv_cache.spare_block is None
    assert buffered.decode_graphs is not None and not buffered.decode_graphs.captured
    assert buffered.kv_cache.spare_block == buffered.num_kv_blocks  # past every sequence's


def test_padded_decodes_give_the_eager_tokens(
    runners: tuple[ModelRunner, ModelRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staggered arrivals: decode batches of 1 to 7 rows (buckets 1, 2, 4, 8: most padded)
    between mixed steps, which run eagerly."""
    eager, buffered = runners
    sizes: list[int] = []
    run = DecodeGraphs.run

    def counted(self: DecodeGraphs, inputs: StepInputs) -> torch.Tensor:
        sizes.append(int(inputs.input_ids.shape[0]))
        return run(self, inputs)

    monkeypatch.setattr(DecodeGraphs, "run", counted)

    def staggered(runner: ModelRunner) -> list[list[int]]:
        harness = RunnerHarness(runner)
        for i, p in enumerate(_prompts()):
            harness.add(str(i), p, NEW_TOKENS, chunk=8)
        step = 0
        while any(not s.done for s in harness.seqs.values()):
            harness.step(only=[str(i) for i in range(len(LENGTHS)) if 3 * i <= step])
            step += 1
        return [harness.seqs[str(i)].output for i in range(len(LENGTHS))]

    assert staggered(buffered) == staggered(eager)
    assert {3, 5, 6, 7} & set(sizes) and 1 in sizes  # padded buckets were taken


def test_padding_rows_write_only_the_spare_block(
    runners: tuple[ModelRunner, ModelRunner],
) -> None:
    """Five decodes (a bucket of 8), then three of them (a bucket of 4, whose fourth row held
    a sequence's slot a step before): only the three decodes' slots and the spare block
    change."""
    eager, _ = runners
    # a fresh pool: another test's same prompts left the same values in the same slots
    buffered = ModelRunner.from_parts(eager.model, eager.model_dir, CACHE, graphs=True)
    harness = RunnerHarness(buffered)
    for i, p in enumerate(_prompts()[:5]):
        harness.add(str(i), p, 4)
    harness.step()  # the prompts
    harness.step()  # five decodes
    before = [(k.clone(), v.clone()) for k, v in buffered.kv_cache.layers]
    three = ["0", "1", "2"]
    harness.step(only=three)
    graphs = buffered.decode_graphs
    assert graphs is not None  # the fourth row, a decode a step ago, now pads:
    assert graphs.ids[3] == graphs.positions[3] == 0 and graphs.slots[3] == graphs.spare_slot
    assert graphs.table[3, 0] == graphs.spare_block
    for bounds in graphs.bounds.values():
        assert bounds[:, 3].tolist() == [0, 0, 1]
    bs = buffered.block_size
    slots = set()
    for rid in three:
        seq = harness.seqs[rid]
        pos = len(seq.tokens) - 2  # the decode's position
        slots.add(seq.blocks[pos // bs] * bs + pos % bs)
    spare = buffered.kv_cache.spare_block
    assert spare is not None
    for (k0, v0), (k1, v1) in zip(before, buffered.kv_cache.layers, strict=True):
        for old, new in ((k0, k1), (v0, v1)):
            changed = (old != new).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
            assert set(changed) - {spare * bs + o for o in range(bs)} == slots


def test_steps_it_does_not_take(runners: tuple[ModelRunner, ModelRunner]) -> None:
    """A prefill chunk in the step, or decodes attending over masks (the gathered path):
    eager."""
    _, buffered = runners
    harness = RunnerHarness(buffered)
    harness.add("a", [5, 6, 7], 2)
    harness.add("b", [8], 2)
    harness.step(only=["b"])
    mixed = [harness.schedule(s) for s in harness.seqs.values()]
    windows = buffered.model.args.windows
    inputs = build_step_inputs(
        mixed, buffered.block_size, windows, buffered.device, paged_kernel=True
    )
    assert not DecodeGraphs.takes(inputs)
    only_decode = build_step_inputs(
        mixed[1:], buffered.block_size, windows, buffered.device, paged_kernel=True
    )
    assert DecodeGraphs.takes(only_decode)
    masked = build_step_inputs(mixed[1:], buffered.block_size, windows, buffered.device)
    assert not DecodeGraphs.takes(masked)  # the gathered path: its shapes change per step


def test_one_table_holds_the_longest_context_for_every_window(
    runners: tuple[ModelRunner, ModelRunner],
) -> None:
    """Every window's view of a bucket reads the one table, wide enough for a sequence at
    max_model_len (a sliding window's bounds start past its first blocks)."""
    _, buffered = runners
    graphs = buffered.decode_graphs
    assert graphs is not None
    blocks = -(-buffered.max_model_len // buffered.block_size)
    assert graphs.table.shape == (decode_graphs.BUCKETS[-1], blocks)
    for b in (1, 24, decode_graphs.BUCKETS[-1]):
        views = graphs._metas[b].decode_views.values()
        assert {v.block_table.data_ptr() for v in views} == {graphs.table.data_ptr()}
        assert all(v.block_table.shape == (b, blocks) for v in views)


def test_per_token_graphs_never_split_a_sequence(runners: tuple[ModelRunner, ModelRunner]) -> None:
    """--deterministic's steps replay graphs whose decode kernel takes each sequence whole: its
    spans on a GPU would depend on the bucket, a token's attention on its batch."""
    _, buffered = runners
    for per_token, splits in ((True, 1), (False, None)):
        graphs = decode_graphs.DecodeGraphs(
            buffered.model, buffered.kv_cache, buffered.max_model_len, per_token
        )
        for b in (1, decode_graphs.BUCKETS[-1]):
            assert {v.splits for v in graphs._metas[b].decode_views.values()} == {splits}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_graphs_replay_the_eager_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("gemma3_cuda")
    make_tiny("gemma3", path)
    config = ModelConfig(model=str(path), dtype="float32", device="cuda")
    graphed = ModelRunner(config, CACHE)
    assert graphed.decode_graphs is not None and graphed.decode_graphs.captured
    eager = ModelRunner.from_parts(graphed.model, graphed.model_dir, CACHE, graphs=False)
    prompts = _prompts()
    assert greedy(graphed, prompts, NEW_TOKENS) == greedy(eager, prompts, NEW_TOKENS)
