"""LoRA adapters are token-exact with transformers + peft (fp32, greedy), alone and mixed in one
batch with the base model and each other, prompts whole or in chunks; on the CPU and, where a
GPU is present, on CUDA against transformers on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from factories import DEVICES, hf_greedy, make_tiny, prompts
from factories.lora import make_adapter

from headrace.config import CacheConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import GREEDY, RunnerHarness, greedy
from headrace.layers.lora import GATHER_MIN_GROUPS, LoraDelta
from headrace.loader.hf import load_model
from headrace.request import SamplingParams

NEW_TOKENS = 16
# (name, rank, alpha, targets, rsLoRA): every projection, attention only, the MLP only
ADAPTERS = [
    ("all", 8, 32, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
     False),
    ("attn", 4, 16, ("q_proj", "v_proj", "o_proj"), True),
    ("mlp", 16, 48, ("gate_proj", "down_proj"), False),
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_adapters_match_peft_alone_and_mixed(arch: str, device: str, tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    hf_base = make_tiny(arch, base_dir)
    ps = prompts(4)
    base_expected = [hf_greedy(hf_base, p, NEW_TOKENS) for p in ps]
    expected: dict[str, list[list[int]]] = {}
    model, _ = load_model(base_dir, torch.float32, torch.device(device), 512)
    runner = ModelRunner.from_parts(model, base_dir, CacheConfig(block_size=4, num_kv_blocks=512))
    ids: dict[str, int] = {}
    for seed, (name, r, alpha, targets, rs) in enumerate(ADAPTERS, start=1):
        peft_model = make_adapter(base_dir, tmp_path / name, seed, r, alpha, targets, rs)
        expected[name] = [hf_greedy(peft_model, p, NEW_TOKENS) for p in ps]
        assert expected[name] != base_expected  # the adapter changes what the model says
        ids[name] = runner.loras.load(name, tmp_path / name)
    for name, want in expected.items():
        assert greedy(runner, ps, NEW_TOKENS, lora_ids=[ids[name]] * len(ps)) == want, name
    # One batch: prompt i under adapter i (0: the base), then rotated, whole and chunked.
    names = [None, "all", "attn", "mlp"]
    for shift in range(2):
        order = names[shift:] + names[:shift]
        lora_ids = [0 if n is None else ids[n] for n in order]
        want = [base_expected[i] if n is None else expected[n][i] for i, n in enumerate(order)]
        for chunk in (None, 5):
            assert greedy(runner, ps, NEW_TOKENS, chunk=chunk, lora_ids=lora_ids) == want


def test_unloaded_adapter_leaves_the_others(tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    hf_base = make_tiny("llama", base_dir)
    ps = prompts(2)
    model, _ = load_model(base_dir, torch.float32, torch.device("cpu"), 512)
    runner = ModelRunner.from_parts(model, base_dir, CacheConfig(block_size=4, num_kv_blocks=256))
    peft_a = make_adapter(base_dir, tmp_path / "a", 1)
    make_adapter(base_dir, tmp_path / "b", 2)
    a, b = runner.loras.load("a", tmp_path / "a"), runner.loras.load("b", tmp_path / "b")
    runner.loras.unload("b")
    assert greedy(runner, ps, 8, lora_ids=[a, 0]) == [
        hf_greedy(peft_a, ps[0], 8),
        hf_greedy(hf_base, ps[1], 8),
    ]
    with pytest.raises(ValueError, match="not loaded"):
        greedy(runner, ps, 8, lora_ids=[b, 0])
    # a reload under the same name gets a new id: KV salted with the old one never matches
    assert runner.loras.load("b", tmp_path / "b") not in (a, b)


def test_sampled_and_greedy_mixed_give_what_they_give_alone(tmp_path: Path) -> None:
    """Seeded sampled requests and greedy ones of the base and three adapters in one batch."""
    base_dir = tmp_path / "base"
    make_tiny("qwen2", base_dir)
    model, _ = load_model(base_dir, torch.float32, torch.device("cpu"), 512)
    runner = ModelRunner.from_parts(model, base_dir, CacheConfig(block_size=4, num_kv_blocks=512))
    ids = [0]
    for seed, (name, r, alpha, targets, rs) in enumerate(ADAPTERS, start=1):
        make_adapter(base_dir, tmp_path / name, seed, r, alpha, targets, rs)
        ids.append(runner.loras.load(name, tmp_path / name))
    ps = prompts(8)
    cases = [
        (f"r{i}", ps[i], ids[i % 4], GREEDY if i % 2 else SamplingParams(temperature=0.9, seed=i))
        for i in range(8)
    ]

    def run(chosen: list[tuple[str, list[int], int, SamplingParams]]) -> dict[str, list[int]]:
        harness = RunnerHarness(runner)
        for rid, prompt, lora_id, params in chosen:
            harness.add(rid, prompt, 12, params, chunk=7, lora_id=lora_id)
        return harness.run()

    alone = {rid: out for case in cases for rid, out in run([case]).items()}
    assert run(cases) == alone
    assert len({tuple(out) for out in alone.values()}) == len(cases)


def test_many_adapters_in_one_step_give_what_each_gives_alone(tmp_path: Path) -> None:
    """From GATHER_MIN_GROUPS adapters in a step their terms come from two batched matmuls over
    gathered weights (layers/lora.py); each request still gets its own adapter's tokens:
    ranks 2-16 padded to one, adapters that skip the attention or the MLP, base rows between."""
    base_dir = tmp_path / "base"
    make_tiny("llama", base_dir)
    model, _ = load_model(base_dir, torch.float32, torch.device("cpu"), 512)
    runner = ModelRunner.from_parts(model, base_dir, CacheConfig(block_size=4, num_kv_blocks=1024))
    count = GATHER_MIN_GROUPS + 2
    ids = []
    for i in range(count):
        targets = ("q_proj", "v_proj", "o_proj") if i % 3 == 1 else ("gate_proj", "down_proj")
        targets = targets if i % 3 else ("q_proj", "k_proj", "up_proj", "down_proj")
        make_adapter(base_dir, tmp_path / f"a{i}", i + 1, r=2 + i * 14 // count, targets=targets)
        ids.append(runner.loras.load(f"a{i}", tmp_path / f"a{i}"))
    lora_ids = [0, *ids, 0]
    ps = prompts(8) + prompts(len(lora_ids) - 8, seed=2)
    alone = [
        greedy(runner, [p], NEW_TOKENS, lora_ids=[i])[0] for p, i in zip(ps, lora_ids, strict=True)
    ]
    assert len({tuple(t) for t in alone}) == len(alone)  # every adapter says something else
    calls = []
    real = LoraDelta._add_gathered

    def spy(self: LoraDelta, *args: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return real(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LoraDelta, "_add_gathered", spy)
        assert greedy(runner, ps, NEW_TOKENS, lora_ids=lora_ids) == alone
    assert calls  # the batch did take the gathered path
