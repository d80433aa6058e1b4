"""A random adapter on the real embedded Gemma 3 270M: our fp32 greedy tokens equal
transformers + peft's on the same GGUF, alone and batched with the base model; in bf16 with
`deterministic`, an adapter request's tokens do not depend on its batch."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from factories import hf_greedy
from factories.lora import write_random_adapter

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.kernels import lora_sgmv
from headrace.loader.tokenizer import load_tokenizer

pytestmark = [pytest.mark.gemma, pytest.mark.slow]
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NEW_TOKENS = 16
BF16 = torch.bfloat16


def test_gemma_adapter_matches_peft(tmp_path: Path, hf_gemma: tuple[Any, Any]) -> None:
    from peft import LoraConfig, get_peft_model

    hf = copy.deepcopy(hf_gemma[0])  # peft injects its layers into the model it is given
    runner = ModelRunner(ModelConfig(dtype="float32", device="cpu"), CacheConfig(num_kv_blocks=64))
    ids = [load_tokenizer(runner.model_dir).encode(p) for p in PROMPTS]
    base = [hf_greedy(hf, p, NEW_TOKENS) for p in ids]
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=16, lora_alpha=16, target_modules=targets, init_lora_weights=False)
    torch.manual_seed(0)
    peft_model = get_peft_model(hf, config).eval()
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = [hf_greedy(peft_model, p, NEW_TOKENS) for p in ids]
    assert expected != base
    lora = runner.loras.load("a", tmp_path / "adapter")
    assert greedy(runner, ids, NEW_TOKENS, lora_ids=[lora, lora]) == expected
    assert greedy(runner, ids, NEW_TOKENS, lora_ids=[lora, 0]) == [expected[0], base[1]]


@pytest.mark.skipif(
    not lora_sgmv.supported(torch.zeros(2, 1, dtype=BF16), torch.zeros(1, 16, dtype=BF16)),
    reason="no C compiler or no AVX-512 BF16: the adapters take torch's path",
)
def test_deterministic_bf16_adapter_rows_are_batch_invariant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 with `deterministic`: the adapters' terms come from lora_sgmv, one row at a time in
    a fixed order, so an adapter request's greedy tokens do not depend on what shares its steps
    (the base's other rows, other adapters)."""
    config = ModelConfig(dtype="bfloat16", device="cpu", deterministic=True)
    runner = ModelRunner(config, CacheConfig(block_size=4, num_kv_blocks=256))
    for seed, name in enumerate("ab"):
        write_random_adapter(runner.model, tmp_path / name, rank=16, seed=seed)
    a, b = runner.loras.load("a", tmp_path / "a"), runner.loras.load("b", tmp_path / "b")
    calls = []
    kernel = lora_sgmv.add

    def counted(*args: torch.Tensor) -> torch.Tensor:
        calls.append(args[0].shape[0])
        return kernel(*args)

    monkeypatch.setattr(lora_sgmv, "add", counted)
    ids = [load_tokenizer(runner.model_dir).encode(p) for p in PROMPTS]
    alone = [greedy(runner, [ids[0]], NEW_TOKENS, lora_ids=[a])[0]]
    alone.append(greedy(runner, [ids[1]], NEW_TOKENS, lora_ids=[b])[0])
    assert calls  # the kernel served them
    base = greedy(runner, [ids[0]], NEW_TOKENS)[0]
    assert alone[0] != base  # the adapter changes the text
    mixed = greedy(runner, [*ids, ids[0], ids[0]], NEW_TOKENS, lora_ids=[a, b, 0, a])
    assert mixed == [alone[0], alone[1], base, alone[0]]
