"""`--int8-matmuls`: which projections get an int8 copy, when the runner makes them, and that
a model's outputs with them stay near its bf16 outputs (tiny random models)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest
import torch
from factories import make_tiny

from headrace.config import CacheConfig, ModelConfig, add_config_args, config_from_args
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.kernels.build import cpu_kernels
from headrace.kernels.int8_linear import int8_dot_cpu
from headrace.layers.linear import MergedLinear
from headrace.models.base import INT8_PROJECTIONS
from headrace.request import SamplingParams

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not int8_dot_cpu(), reason="no C compiler or no int8 dot products"
)


def int8_layers(runner: ModelRunner) -> list[str]:
    return [
        name
        for name, m in runner.model.named_modules()
        if isinstance(m, MergedLinear) and m.int8 is not None
    ]


def make_runner(path: Path, dtype: str, int8: str) -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=str(path), dtype=dtype, device="cpu", int8_matmuls=int8),
        CacheConfig(block_size=4, num_kv_blocks=256),
    )


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_only_norm_fed_projections_are_quantized(
    arch: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_tiny(arch, tmp_path)
    names = int8_layers(make_runner(tmp_path, "bfloat16", "on"))
    layers = 2  # the tiny models' depth
    assert len(names) == len(INT8_PROJECTIONS) * layers
    assert {n.rsplit(".", 1)[-1] for n in names} == set(INT8_PROJECTIONS)
    assert int8_layers(make_runner(tmp_path, "bfloat16", "off")) == []
    # fp32 never: it stays token-exact with transformers
    assert int8_layers(make_runner(tmp_path, "float32", "auto")) == []
    with caplog.at_level(logging.WARNING, logger="headrace.engine.runner.model_runner"):
        assert int8_layers(make_runner(tmp_path, "float32", "on")) == []
    assert "--int8-matmuls on: unavailable here" in caplog.text


def test_int8_prefill_logits_stay_near_bf16(tmp_path: Path) -> None:
    make_tiny("gemma3", tmp_path)
    plain, int8 = (make_runner(tmp_path, "bfloat16", m) for m in ("off", "on"))
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 200, (48,), generator=gen)
    positions = torch.arange(48)
    outs = []
    for runner in (plain, int8):
        req = ScheduledRequest("r", ids.tolist(), 0, list(range(12)), True, SamplingParams(), 0)
        step = build_step_inputs([req], 4, runner.model.args.windows, runner.device, runner.dtype)
        assert torch.equal(step.positions, positions)
        with torch.inference_mode():
            hidden = runner.model(step.input_ids, step.positions, runner.kv_cache.layers, step.meta)
            outs.append(runner.model.compute_logits(hidden).float())
    a, b = outs
    assert not torch.equal(a, b)  # 48 rows: the int8 path ran
    rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
    assert rel.max() < 0.1, rel
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean()
    assert agree >= 0.9, agree


def test_the_flag_parses_and_checks_its_value() -> None:
    parser = argparse.ArgumentParser()
    add_config_args(parser, ModelConfig)
    args = parser.parse_args(["--int8-matmuls", "off"])
    assert config_from_args(ModelConfig, args).int8_matmuls == "off"
    assert ModelConfig().int8_matmuls == "auto"
    with pytest.raises(ValueError, match="int8_matmuls"):
        ModelConfig(int8_matmuls="maybe")
