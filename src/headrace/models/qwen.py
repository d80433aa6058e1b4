"""Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on q and k per head): Llama with two flags."""

from __future__ import annotations

from typing import Any

from headrace.models.args import ModelArgs, Window, common_args, layer_windows
from headrace.models.llama import LlamaForCausalLM


def qwen_windows(cfg: dict[str, Any]) -> tuple[Window, ...]:
    """Older configs state `use_sliding_window` + `max_window_layers` instead of `layer_types`."""
    n = int(cfg["num_hidden_layers"])
    if not cfg.get("use_sliding_window", False) or cfg.get("sliding_window") is None:
        return (None,) * n
    if cfg.get("layer_types") is not None:
        return layer_windows(cfg, n)
    first = cfg.get("max_window_layers", n)
    return tuple(cfg["sliding_window"] if i >= first else None for i in range(n))


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def parse_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        return common_args(
            cfg, attention_bias=True, o_proj_bias=False, layer_windows=qwen_windows(cfg)
        )


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def parse_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        return common_args(cfg, qk_norm=True, layer_windows=qwen_windows(cfg))
