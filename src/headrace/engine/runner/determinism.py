"""The load-time choice of a model's matmul paths: int8 where it pays, a GGUF's own quantized
blocks for decode steps, or, with `--deterministic`, one row-independent path for every step
size.

What makes a greedy request's tokens depend on what shares its steps (measured on Gemma 3 270M
in bf16, docs/engine.md): the int8 matmuls start at 5 rows per step (32 where only oneDNN's
int8 runs), so a prompt's hidden states change when neighbours push its step past that;
oneDNN's bf16 matmul (past 64 rows) blocks its sums by the row count; prefill chunks attend
through other kernels than decodes. The deterministic mode takes int8 off, sends every step
through bf16_linear (each row's sums its own, in a fixed order) and lets every token attend as
a decode of its own (`build_step_inputs(per_token=True)`); greedy picks come from the int8
head, exact per row.
"""

from __future__ import annotations

import logging
from pathlib import Path

from headrace.config import ModelConfig
from headrace.layers.linear import MergedLinear
from headrace.loader.blocks import attach_blocks
from headrace.models.base import CausalLM

log = logging.getLogger("headrace.engine.runner.model_runner")  # the runner's load-time lines


def choose_matmuls(model: CausalLM, config: ModelConfig, model_dir: Path) -> None:
    if config.deterministic:
        switched, total = model.make_row_invariant()
        if switched < total:
            log.warning(
                "--deterministic: %d of %d projections have no row-independent kernel here "
                "(bf16 with AVX-512 BF16 only): their sums may still depend on the step's size",
                total - switched,
                total,
            )
        log.info("deterministic: int8 matmuls off, row-independent matmuls, per-token attention")
        return
    if config.gguf_blocks == "auto":
        used, total = attach_blocks(model, model_dir)
        if used:
            log.info("GGUF blocks: %d of %d projections, in steps of 1-4 tokens", used, total)
        if model.q8_head is not None:
            log.info("GGUF blocks: the head's Q8_0, in steps of 1-4 rows")
    if config.int8_matmuls == "off":
        return
    # `on` keeps int8 in steps with LoRA adapter rows too; `auto` computes those in bf16
    quantized = model.quantize_matmuls(with_lora=config.int8_matmuls == "on")
    if quantized:
        int8s = [m.int8 for m in model.modules() if isinstance(m, MergedLinear) and m.int8]
        rows = min(lin.min_rows for lin in int8s)
        log.info("int8 matmuls: %d projections, in steps of %d+ tokens", quantized, rows)
    elif config.int8_matmuls == "on":
        log.warning("--int8-matmuls on: unavailable here (bf16 on a CPU with VNNI/AMX)")
