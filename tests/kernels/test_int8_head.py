"""The int8 greedy head picks exactly the argmax of the full-precision logits x . w_v, on random
weights (every row count and padding) and on the real Gemma 3 head with real hidden states."""

from __future__ import annotations

import pytest
import torch

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.head_picks import head_argmax
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import GREEDY
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.kernels.int8_head import Int8GreedyHead, supported
from headrace.loader.tokenizer import load_tokenizer

pytestmark = pytest.mark.skipif(
    not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
    reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
)


def full_precision_argmax(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().t()).argmax(dim=-1)


@pytest.mark.parametrize("hidden", [96, 128])  # AMX takes whole 64-deep slices: 128 only
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 32, 64, 100])
def test_random_head_every_row_count(rows: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    vocab = 5000 + rows  # not a multiple of 64: padding rows exist
    w = (torch.randn(vocab, hidden, generator=gen) * 0.05).bfloat16()
    w[7] = 0  # an all-zero row: scale 0
    head = Int8GreedyHead(w)
    for trial in range(20):
        x = (torch.randn(rows, hidden, generator=gen) * (1 + trial)).bfloat16()
        assert torch.equal(head.argmax(x), full_precision_argmax(x, w))


def test_near_ties_resolved_in_full_precision() -> None:
    """Rows that differ below the int8 grid: the screen cannot tell them apart, the rescoring
    must; an exact duplicate row loses to the first copy."""
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(4096, 64, generator=gen) * 0.05).bfloat16()
    x = torch.randn(3, 64, generator=gen).bfloat16()
    top = full_precision_argmax(x, w)
    for r in range(3):
        best = w[top[r]].clone()
        nudged = best.float()
        nudged[int(x[r].float().abs().argmax())] += 0.002 * float(torch.sign(x[r].float()).max())
        w[1000 + r] = nudged.bfloat16()
    w[3000] = w[1000]  # a duplicate of a (possible) winner, later in the vocabulary
    head = Int8GreedyHead(w)
    assert torch.equal(head.argmax(x), full_precision_argmax(x, w))


@pytest.mark.gemma
def test_real_gemma_head_and_hidden_states() -> None:
    runner = ModelRunner(ModelConfig(dtype="bfloat16", device="cpu"), CacheConfig(num_kv_blocks=64))
    head = runner.wait_greedy_head()
    assert head is not None and runner.greedy_head is head
    tokenizer = load_tokenizer(runner.model_dir)
    texts = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time", "1, 2, 3,"]
    reqs = [
        ScheduledRequest(
            str(i), tokenizer.encode(t), 0, [i * 4 + j for j in range(4)], True, GREEDY, 0
        )
        for i, t in enumerate(texts)
    ]
    inputs = build_step_inputs(reqs, runner.block_size, runner.model.args.windows, runner.device)
    with torch.inference_mode():
        hidden = runner.model(
            inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta
        )
    # every prompt position, not only the last: 40-odd real hidden states
    w = runner.model.embed_weight
    step = max(head.max_rows, 4)
    for start in range(0, hidden.shape[0], step):
        x = hidden[start : start + step]
        assert torch.equal(head.argmax(x), full_precision_argmax(x, w))


def test_more_rows_than_max_rows_run_in_blocks() -> None:
    """A step past the head's sweet spot still gets every row's exact pick (engine/head_picks)."""
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(3000, 64, generator=gen) * 0.05).bfloat16()
    x = torch.randn(11, 64, generator=gen).bfloat16()
    head = Int8GreedyHead(w)
    head.max_rows = 4
    assert head_argmax(head, x) == full_precision_argmax(x, w).tolist()
