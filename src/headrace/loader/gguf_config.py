"""A transformers config.json dict from a GGUF file's metadata (llama.cpp key names)."""

from __future__ import annotations

from typing import Any

from headrace.loader.errors import ModelLoadError

ARCHITECTURES = {
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}


def hf_config(meta: dict[str, Any], tensor_names: tuple[str, ...], source: str) -> dict[str, Any]:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{source}: unsupported GGUF architecture {arch!r}; supported: {sorted(ARCHITECTURES)}"
        )
    hf_arch, model_type = ARCHITECTURES[arch]

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    heads = key("attention.head_count")
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length") or key("embedding_length") // heads,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": key("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    if arch == "gemma3":
        cfg.update(_gemma3(key, cfg["num_hidden_layers"]))
    else:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": key("rope.freq_base", 1e4)}
        cfg["rope_parameters"].update(_scaling(key))
        cfg["attention_bias"] = any(n.endswith("attn_q.bias") for n in tensor_names)
    return cfg


def _scaling(key: Any) -> dict[str, Any]:
    kind = key("rope.scaling.type")
    if kind in (None, "none"):
        return {}
    out: dict[str, Any] = {"rope_type": kind, "factor": key("rope.scaling.factor", 1.0)}
    if key("rope.scaling.original_context_length"):
        out["original_max_position_embeddings"] = key("rope.scaling.original_context_length")
    return out


def _gemma3(key: Any, num_layers: int) -> dict[str, Any]:
    """Facts the file may leave out take llama.cpp's values (which match transformers' for the
    released sizes): every 6th layer global, attention scaled by the head size."""
    pattern = key("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # one flag per layer: True = sliding
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [bool((i + 1) % pattern) for i in range(num_layers)]
    full = {"rope_type": "default", "rope_theta": key("rope.freq_base", 1_000_000.0)}
    full.update(_scaling(key))
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": key("attention.key_length", 256),
        "sliding_window": key("attention.sliding_window", 4096),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": key("rope.freq_base_swa", 10_000.0),
            },
        },
        "final_logit_softcapping": key("final_logit_softcapping"),
        "attn_logit_softcapping": None,
        "attention_bias": False,
    }
