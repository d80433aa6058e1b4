"""`--torch-compile` (layers/compiled.py): each layer's small ops go through torch.compile as
one graph apiece (no break: `fullgraph`), and the model's tokens are the eager ones.

On the CPU the ops are traced through "aot_eager" (dynamo and AOT autograd, no code generated:
the same aten ops run), with `takes` forced on; the CUDA leg compiles with inductor for real
and compares logits within bf16 rounding."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from factories import VOCAB, make_tiny

from headrace.commands.serve import add_arguments
from headrace.config import CacheConfig, HeadraceConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.layers import compiled
from headrace.layers.rotary import _rotate, apply_rotary

CACHE = CacheConfig(block_size=4, num_kv_blocks=200)


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Compiled ops on the CPU (aot_eager); yields the names of the functions run compiled."""
    seen: list[str] = []
    run = compiled.run

    def counted(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        seen.append(fn.__name__)
        return run(fn, *args)

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    monkeypatch.setattr(compiled, "takes", lambda x: True)
    monkeypatch.setattr(compiled, "run", counted)
    compiled._compiled.cache_clear()
    yield seen
    compiled._compiled.cache_clear()
    torch._dynamo.reset()  # no compiled code or guards left for the tests after


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in (1, 5, 13)]


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_compiled_small_ops_give_the_eager_tokens(
    arch: str, tmp_path_factory: pytest.TempPathFactory, traced: list[str]
) -> None:
    """Gemma 3 (offset norms with residual adds, q/k norms, gelu) and Qwen 3 (plain norms,
    q/k norms, silu): every norm, rotation and gated activation of a step runs compiled."""
    path = tmp_path_factory.mktemp(arch)
    make_tiny(arch, path)
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32", device="cpu"), CACHE)
    compiled_on = compiled.takes
    compiled.takes = lambda x: False  # type: ignore[assignment]
    want = greedy(runner, _prompts(), 6)
    assert not traced
    compiled.takes = compiled_on  # type: ignore[assignment]
    assert greedy(runner, _prompts(), 6) == want
    layers = runner.model.args.num_layers
    per_layer = 7 if arch == "gemma3" else 5  # gemma: 2 more norms (post-attention, post-MLP)
    steps = len(traced) // (per_layer * layers + 1)  # + the final norm
    assert steps > 0 and len(traced) == steps * (per_layer * layers + 1)
    # Llama's family adds its residuals apart from the norms
    names = {"_rms_norm", "_rms_norm_heads", "_rotate", "_gated"}  # 2-D and per-head norms
    names |= {"_add_norm"} if arch == "gemma3" else set()
    assert set(traced) == names


def test_compiled_partial_rotary_rotates_only_its_share(traced: list[str]) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 3, 16, generator=gen)
    cos, sin = torch.randn(5, 1, 8, generator=gen), torch.randn(5, 1, 8, generator=gen)
    out = apply_rotary(x, cos, sin)
    assert traced == ["_rotate"]
    assert torch.equal(out[..., 8:], x[..., 8:])
    want = x[..., :8] * cos + x[..., :8].roll(4, dims=-1) * sin
    assert torch.equal(out[..., :8], want)


def test_a_function_past_the_recompile_limit_runs_eagerly_from_then_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torch._dynamo.exc import FailOnRecompileLimitHit  # Triton with it: not at collection

    calls: list[int] = []

    def too_many(fn: Callable[..., torch.Tensor], backend: str) -> Callable[..., torch.Tensor]:
        def fails(*args: Any) -> torch.Tensor:
            calls.append(1)
            raise FailOnRecompileLimitHit("cache_size_limit reached")

        return fails

    monkeypatch.setattr(compiled, "_compiled", too_many)
    monkeypatch.setattr(compiled, "_eager", set())
    x = torch.randn(3, 2, 8)  # [T, H, D]: cos 1 and sin 0 leave it as it is
    for _ in range(3):
        out = compiled.run(_rotate, x, torch.ones(3, 1, 8), torch.zeros(3, 1, 8))
        assert torch.equal(out, x)
    assert calls == [1] and "too many shape variants" in caplog.text


def test_only_cuda_compiles_and_only_when_asked() -> None:
    cpu = torch.zeros(2)
    for on in (True, False):
        compiled.enable(on)
        assert not compiled.takes(cpu)  # the CPU has its own fused C kernels
    assert not compiled.takes(torch.zeros(2, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_compiled_logits_are_the_eager_ones_within_bf16(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Inductor for real, under CUDA graphs: a prefill and decodes of a tiny Gemma 3 in bf16
    give logits within bf16 rounding of the eager model's, and greedy tokens mostly alike."""
    path = tmp_path_factory.mktemp("gemma3_compile_cuda")
    make_tiny("gemma3", path)
    config = ModelConfig(model=str(path), dtype="bfloat16", device="cuda", torch_compile=True)
    try:
        fused = ModelRunner(config, CACHE)
        assert compiled.takes(torch.zeros(1, device="cuda"))
        prompts = _prompts()
        got = greedy(fused, prompts, 8)
        compiled.enable(False)
        eager = ModelRunner.from_parts(fused.model, fused.model_dir, CACHE, graphs=False)
        want = greedy(eager, prompts, 8)
    finally:
        compiled.enable(False)
    same = sum(a == b for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))
    assert same >= 0.9 * sum(map(len, want))


def test_the_flag_reaches_the_model_config_and_the_runner_leaves_the_cpu_eager(
    tmp_path: Path,
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert HeadraceConfig.from_args(parser.parse_args(["--torch-compile"])).model.torch_compile
    assert not HeadraceConfig.from_args(parser.parse_args([])).model.torch_compile
    make_tiny("qwen3", tmp_path)
    config = ModelConfig(model=str(tmp_path), dtype="float32", device="cpu", torch_compile=True)
    ModelRunner(config, CACHE)
    assert not compiled._enabled  # asked for on the CPU: nothing to compile there
