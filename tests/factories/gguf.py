"""Write a tiny GGUF from a transformers model the way llama.cpp's converter does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from headrace.loader.gguf import unpermute

HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GEMMA_NORMS = {
    "pre_feedforward_layernorm": "ffn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k permutation (rotate-half -> interleaved rope layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(hf: str, gemma: bool) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    names = {**HF_TO_GGUF, **(GEMMA_NORMS if gemma else {"post_attention_layernorm": "ffn_norm"})}
    return f"blk.{layer}.{names[module]}.{suffix}"


def write_tiny_gguf(
    model: Any, arch: str, path: Path, layers: GGMLQuantizationType | None = None
) -> None:
    """Write `model` (tiny Llama or Gemma 3) as a GGUF; the embedding goes in as Q8_0 (and the
    layers' projections as `layers`, where given), and `model`'s tensors are replaced by their
    dequantized values so both sides hold the same."""
    cfg = model.config
    gemma = arch == "gemma3"
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if gemma:
        w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    else:
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"t{i}" for i in range(4, cfg.vocab_size)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([3, 3, 3, 2] + [1] * (len(tokens) - 4))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_pad_token_id(0)
    for name, tensor in model.state_dict().items():
        data = tensor.float().numpy().copy()
        if gemma and name.endswith("norm.weight"):
            data = data + 1  # llama.cpp stores Gemma norms as w + 1
        if not gemma and ".q_proj." in name:
            data = permute(data, cfg.num_attention_heads)
        if not gemma and ".k_proj." in name:
            data = permute(data, cfg.num_key_value_heads)
        if name == "model.embed_tokens.weight":
            q8 = quantize(data, GGMLQuantizationType.Q8_0)
            tensor.copy_(_torch(dequantize(q8, GGMLQuantizationType.Q8_0)))
            w.add_tensor(gguf_name(name, gemma), q8, raw_dtype=GGMLQuantizationType.Q8_0)
        elif layers is not None and "_proj.weight" in name:
            packed = quantize(data, layers)
            back = dequantize(packed, layers)
            if not gemma and (".q_proj." in name or ".k_proj." in name):
                heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
                back = unpermute(back, heads)
            tensor.copy_(_torch(back))
            w.add_tensor(gguf_name(name, gemma), packed, raw_dtype=layers)
        elif name != "lm_head.weight" or not cfg.tie_word_embeddings:
            w.add_tensor(gguf_name(name, gemma), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _torch(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))
