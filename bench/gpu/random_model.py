"""A runner around a model of a given shape (bench/gpu/shapes/*.json, Hugging Face config
files) with random bf16 weights made on the device: the GPU machine has no model files, and
an 8B model's 16 GB would not travel. Speed does not depend on the weights' values."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from headrace.config import CacheConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.loader.hf import resolve_class
from headrace.models.args import ModelArgs
from headrace.models.base import CausalLM

SHAPES = Path(__file__).resolve().parent / "shapes"
QUICK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "head_dim": 16}


def random_runner(
    name: str, device: torch.device, kv_tokens: int, quick: bool, graphs: bool | None = None
) -> ModelRunner:
    """A runner for shape `name` with room for `kv_tokens` tokens of KV (+ a margin);
    `graphs` as `ModelRunner.from_parts` takes it (None: CUDA graphs on CUDA)."""
    path = SHAPES / f"{name}.json"
    cfg = json.loads(path.read_text())
    if quick:  # the same architecture, tiny: checks the script on the CPU
        cfg.update(QUICK, vocab_size=1024, num_attention_heads=4, num_key_value_heads=1)
    cls = resolve_class(cfg, path)
    args = cls.parse_config(cfg)
    max_len = 4096
    model = random_model(cls, args, device, max_len)
    block = 16
    blocks = kv_tokens // block + 2 * (kv_tokens // 1024 + 64)
    cache = CacheConfig(block_size=block, num_kv_blocks=blocks, enable_prefix_caching=False)
    return ModelRunner.from_parts(
        model, None, cache, max_model_len=max_len, model_name=name, graphs=graphs
    )


def random_model(
    cls: type[CausalLM], args: ModelArgs, device: torch.device, max_len: int
) -> CausalLM:
    with torch.device("meta"):
        model = cls(args)
    gen = torch.Generator(device=device).manual_seed(0)
    for name, param in list(model.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        value = torch.empty(param.shape, dtype=torch.bfloat16, device=device)
        value.normal_(0.0, 0.02, generator=gen)
        setattr(model.get_submodule(owner), leaf, nn.Parameter(value, requires_grad=False))
    model.setup(max_len, device)
    return model.eval()


def weight_bytes(model: CausalLM) -> int:
    """Bytes a decode step reads of the weights (a tied head counted once: it is read twice,
    as the embedding's few rows and as the head, but the embedding's rows are negligible)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def kv_bytes_per_token(args: ModelArgs, context: int) -> int:
    """KV bytes one sequence of `context` tokens makes a decode step read (bf16; a sliding
    layer reads its window only)."""
    per_layer = 2 * args.num_kv_heads * args.head_dim * 2
    windows = args.layer_windows or (None,) * args.num_layers
    return sum(per_layer * min(context, w or context) for w in windows)
