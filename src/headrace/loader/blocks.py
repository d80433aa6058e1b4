"""Give a loaded model's projections the quantized blocks its GGUF stored them in
(`gguf_blocks.py`, kept by the conversion in BLOCKS_FILE), for decode steps that compute with
them (`MergedLinear.use_blocks`, kernels/block_linear.py), and a tied head its embedding's Q8_0
blocks (`CausalLM.use_head_blocks`, kernels/q8_head.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from headrace.layers.linear import MergedLinear
from headrace.loader.hf import BLOCKS_FILE
from headrace.loader.weights import part_names
from headrace.models.base import CausalLM

PARTS = ("codes", "scale", "offset")


def attach_blocks(model: CausalLM, model_dir: Path) -> tuple[int, int]:
    """(layer projections given their blocks, layer projections): a merged one takes them only
    where every part has blocks (Gemma 3 270M's q_proj and k_proj are Q5_0, but in 9 of its
    layers v_proj is Q8_0, whose blocks are not kept: those qkv_proj keep the bf16 path)."""
    linears = [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, MergedLinear) and n.startswith("model.layers.")
    ]
    path = model_dir / BLOCKS_FILE
    if not path.is_file() or all(m.small is None for _, m in linears):
        return 0, len(linears)  # no file, or no bf16 decode kernel here (fp32, CUDA, ...)
    used = 0
    with safe_open(str(path), framework="pt") as f:
        stored = set(f.keys())  # noqa: SIM118 - safe_open is not a mapping
        for name, module in linears:
            parts = part_names(f"{name}.weight", module)
            if module.small is None or not all(f"{p}.{k}" in stored for p in parts for k in PARTS):
                continue
            codes, scale, offset = ([f.get_tensor(f"{p}.{k}") for p in parts] for k in PARTS)
            if len({c.shape[1] // s.shape[1] for c, s in zip(codes, scale, strict=True)}) > 1:
                continue  # parts with blocks of different sizes
            used += module.use_blocks(torch.cat(codes), torch.cat(scale), torch.cat(offset))
        head = "model.embed_tokens.weight"
        if all(f"{head}.{k}" in stored for k in PARTS):
            model.use_head_blocks(*(f.get_tensor(f"{head}.{k}") for k in PARTS))
    return used, len(linears)
