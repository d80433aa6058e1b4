"""The shape of a decoder-only model, parsed from a Hugging Face `config.json` dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headrace.layers.rotary import normalize_rope

Window = int | None


@dataclass(frozen=True)
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    hidden_act: str
    tie_word_embeddings: bool
    attention_bias: bool = False  # bias on q/k/v
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    layer_windows: tuple[Window, ...] = ()  # per layer: sliding window or None
    layer_rope: tuple[str, ...] = ()  # per layer: key into `rope`
    rope: dict[str, dict[str, Any]] = field(default_factory=dict)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma)
    final_logit_softcapping: float | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def windows(self) -> tuple[Window, ...]:
        """Distinct windows across layers, full attention (None) first."""
        return tuple(sorted(set(self.layer_windows), key=lambda w: -1 if w is None else w))

    @property
    def attn_scale(self) -> float:
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5


def common_args(cfg: dict[str, Any], **overrides: Any) -> ModelArgs:
    """Fields every family spells alike; the family passes what differs."""
    heads = cfg["num_attention_heads"]
    num_layers = cfg["num_hidden_layers"]
    max_pos = cfg.get("max_position_embeddings", 4096)
    values: dict[str, Any] = dict(
        architecture=cfg["architectures"][0],
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=max_pos,
        hidden_act=cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        o_proj_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        layer_windows=layer_windows(cfg, num_layers),
        layer_rope=("default",) * num_layers,
        rope={"default": rope_params(cfg, cfg.get("rope_parameters"), max_pos)},
        eos_token_ids=_ids(cfg.get("eos_token_id")),
        bos_token_id=cfg.get("bos_token_id"),
    )
    values.update(overrides)
    return ModelArgs(**values)


def layer_windows(
    cfg: dict[str, Any], num_layers: int, all_sliding: bool = False
) -> tuple[Window, ...]:
    """Sliding window per layer from `layer_types`, or on every layer when `all_sliding`."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if window is None:
        return (None,) * num_layers
    if types is None:
        return (window if all_sliding else None,) * num_layers
    return tuple(window if t == "sliding_attention" else None for t in types)


def rope_params(
    cfg: dict[str, Any],
    params: dict[str, Any] | None,
    max_pos: int,
    theta: float | None = None,
    scaling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out = normalize_rope(params, theta or cfg.get("rope_theta"), scaling or cfg.get("rope_scaling"))
    if out["rope_type"] in ("llama3", "yarn"):
        out.setdefault("original_max_position_embeddings", max_pos)
    if "partial_rotary_factor" in cfg:
        out.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    return out


def _ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, int) else tuple(value)
