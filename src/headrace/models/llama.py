"""Llama-style decoder (Llama, Mistral; Qwen2/Qwen3 reuse it with bias / q-k norm flags)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headrace.layers.activation import gated, get_activation
from headrace.layers.attention import AttentionMetadata, paged_attention
from headrace.layers.linear import Linear, MergedLinear
from headrace.layers.norm import RMSNorm, rms_norm, stacked_head_scale
from headrace.layers.rotary import apply_rotary
from headrace.models.args import ModelArgs, common_args, layer_windows
from headrace.models.base import CausalLM, CosSin, Embedding, KVCaches


class LlamaAttention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int) -> None:
        super().__init__()
        hq, hkv, d = args.num_heads, args.num_kv_heads, args.head_dim
        self.shape = (hq, hkv, d)
        self.qkv_proj = MergedLinear(
            args.hidden_size, [hq * d, hkv * d, hkv * d], args.attention_bias
        )
        self.o_proj = Linear(hq * d, args.hidden_size, args.o_proj_bias)
        self.q_norm = RMSNorm(d, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(d, args.rms_norm_eps) if args.qk_norm else None
        self.window = args.layer_windows[layer_idx]
        self.rope_key = args.layer_rope[layer_idx]
        self.scale = args.attn_scale
        self.qk_scale: torch.Tensor | None = None

    def prepare(self) -> None:
        if self.q_norm is not None and self.k_norm is not None:
            hq, hkv, _ = self.shape
            self.qk_scale = stacked_head_scale(self.q_norm, self.k_norm, hq, hkv)

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        cos_sin: CosSin,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        hq, hkv, d = self.shape
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) * D]
        qk = qkv[:, : (hq + hkv) * d].view(-1, hq + hkv, d)  # q and k heads side by side
        v = qkv[:, (hq + hkv) * d :].view(-1, hkv, d)  # [T, Hkv, D]
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3
            scale = self.qk_scale
            if scale is None:
                scale = stacked_head_scale(self.q_norm, self.k_norm, hq, hkv)
            qk = rms_norm(qk, scale, self.q_norm.eps, offset=False)
        cos, sin = cos_sin[self.rope_key]
        qk = apply_rotary(qk, cos, sin)  # [T, Hq + Hkv, D]
        out = paged_attention(
            qk[:, :hq], qk[:, hq:], v, kv[0], kv[1], meta, self.scale, self.window
        )
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        inter = args.intermediate_size
        self.gate_up_proj = MergedLinear(args.hidden_size, [inter, inter], args.mlp_bias)
        self.down_proj = Linear(inter, args.hidden_size, args.mlp_bias)
        self.act = get_activation(args.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.down_proj(gated(self.act, self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(args, layer_idx)
        self.mlp = LlamaMLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: CosSin,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, kv, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = Linear(args.hidden_size, args.vocab_size)

    @classmethod
    def parse_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        return common_args(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: KVCaches,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed(input_ids)  # [T, H]
        cos_sin = self.cos_sin(positions, x.dtype)
        for layer, kv in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, cos_sin, kv, meta)
        return self.model.norm(x)


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def parse_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        # Mistral's `sliding_window`, when set, applies to every layer.
        windows = layer_windows(cfg, cfg["num_hidden_layers"], all_sliding=True)
        return common_args(cfg, layer_windows=windows)
