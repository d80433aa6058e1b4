"""Gemma 3 (text): (1 + w) RMSNorm around attention and MLP, q/k norm, a sqrt(hidden) embedding
scale, sliding-window layers with their own rope base, and a tied output head."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headrace.layers.attention import AttentionMetadata, paged_attention
from headrace.layers.linear import Linear, MergedLinear
from headrace.layers.norm import RMSNorm, rms_norm, stacked_head_scale
from headrace.layers.rotary import apply_rotary
from headrace.models.args import ModelArgs, common_args, rope_params
from headrace.models.base import CausalLM, CosSin, Embedding, KVCaches
from headrace.models.llama import LlamaMLP

FULL, SLIDING = "full_attention", "sliding_attention"


def parse_gemma3_config(cfg: dict[str, Any]) -> ModelArgs:
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or [
        SLIDING if (i + 1) % cfg.get("sliding_window_pattern", 6) else FULL for i in range(n)
    ]
    window = cfg.get("sliding_window", 4096)
    max_pos = cfg.get("max_position_embeddings", 131072)
    nested = cfg.get("rope_parameters") or {}
    rope = {
        FULL: rope_params(
            cfg,
            nested.get(FULL),
            max_pos,
            cfg.get("rope_theta", 1_000_000.0),
            cfg.get("rope_scaling"),
        ),
        # Older configs: the local base is `rope_local_base_freq`, and rope_scaling is global only.
        SLIDING: rope_params(
            {}, nested.get(SLIDING), max_pos, cfg.get("rope_local_base_freq", 10_000.0), None
        ),
    }
    return common_args(
        cfg,
        hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qk_norm=True,
        layer_windows=tuple(window if t == SLIDING else None for t in types),
        layer_rope=tuple(types),
        rope=rope,
        query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        max_position_embeddings=max_pos,
    )


class Gemma3Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int) -> None:
        super().__init__()
        hq, hkv, d = args.num_heads, args.num_kv_heads, args.head_dim
        self.shape = (hq, hkv, d)
        self.qkv_proj = MergedLinear(
            args.hidden_size, [hq * d, hkv * d, hkv * d], args.attention_bias
        )
        self.o_proj = Linear(hq * d, args.hidden_size, args.o_proj_bias)
        self.q_norm = RMSNorm(d, args.rms_norm_eps, offset=True)
        self.k_norm = RMSNorm(d, args.rms_norm_eps, offset=True)
        self.window = args.layer_windows[layer_idx]
        self.rope_key = args.layer_rope[layer_idx]
        self.scale = args.attn_scale
        self.qk_scale: torch.Tensor | None = None

    def prepare(self) -> None:
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
        scale = self.qk_scale
        if scale is None:
            scale = stacked_head_scale(self.q_norm, self.k_norm, hq, hkv)
        qk = rms_norm(qk, scale, self.q_norm.eps, offset=True)  # [T, Hq + Hkv, D]
        cos, sin = cos_sin[self.rope_key]
        qk = apply_rotary(qk, cos, sin)
        q, k = qk[:, :hq], qk[:, hq:]
        out = paged_attention(q, k, v, kv[0], kv[1], meta, self.scale, self.window)
        return self.o_proj(out)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int) -> None:
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = Gemma3Attention(args, layer_idx)
        self.mlp = LlamaMLP(args)
        self.input_layernorm = RMSNorm(h, eps, offset=True)
        self.post_attention_layernorm = RMSNorm(h, eps, offset=True)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, offset=True)
        self.post_feedforward_layernorm = RMSNorm(h, eps, offset=True)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: CosSin,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        attn = self.self_attn(self.input_layernorm(x), cos_sin, kv, meta)
        x = self.post_attention_layernorm(attn, residual=x)  # x + norm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(x))
        return self.post_feedforward_layernorm(mlp, residual=x)


class Gemma3TextModel(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, offset=True)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.model = Gemma3TextModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = Linear(args.hidden_size, args.vocab_size)

    @classmethod
    def parse_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        return parse_gemma3_config(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: KVCaches,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed(input_ids)  # [T, H]
        # transformers scales by a float32 scalar cast to the weights' dtype first
        x = x * torch.tensor(self.args.hidden_size**0.5).to(x.dtype).item()
        cos_sin = self.cos_sin(positions, x.dtype)
        for layer, kv in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, cos_sin, kv, meta)
        return self.model.norm(x)
