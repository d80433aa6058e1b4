"""Tiny random-weight Hugging Face checkpoints made with transformers' own config classes.

- `make_tiny(arch, path)`: every family the loader knows (`ARCHS`), word-level tokenizer,
  weights scaled so that greedy choices are decisive: the parity tests pin our outputs to
  transformers' on these.
- `make_tiny_llama(path)`: the Llama the servers run (`tokenizer="chat"`: byte-level BPE with a
  chat template) or the engine's real-model tests use (`"sentencepiece"`), transformers' own
  initialisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer

from factories.tokenizers import (
    CHAT_TOKENIZER_CONFIG,
    SP_TOKENIZER_CONFIG,
    WORD_TOKENIZER_CONFIG,
    WORD_VOCAB,
    make_chat_tokenizer,
    make_sentencepiece_tokenizer,
    make_word_tokenizer,
    save_tokenizer,
)

VOCAB = WORD_VOCAB
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)

ARCHS = ("llama", "llama_scaled", "mistral", "qwen2", "qwen3", "gemma3")
# Gemma 3 as a GGUF can say: the attention scale is the head size's, as llama.cpp assumes.
GGUF_GEMMA3 = {"query_pre_attn_scalar": 16}


def hf_config(arch: str, **overrides: Any) -> Any:
    import transformers as tf

    if arch == "llama":
        return tf.LlamaConfig(**COMMON)
    if arch == "llama_scaled":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return tf.LlamaConfig(**COMMON, rope_parameters=rope)
    if arch == "mistral":
        return tf.MistralConfig(**COMMON, sliding_window=24)
    if arch == "qwen2":
        return tf.Qwen2Config(**COMMON)
    if arch == "qwen3":
        return tf.Qwen3Config(**{**COMMON, "tie_word_embeddings": True}, head_dim=32)
    if arch == "gemma3":
        return tf.Gemma3TextConfig(
            **{**COMMON, "tie_word_embeddings": True},
            head_dim=16,
            query_pre_attn_scalar=overrides.get("query_pre_attn_scalar", 24),
            sliding_window=12,
            layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=30.0,
        )
    raise ValueError(arch)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that greedy choices are decisive, and non-trivial norms/biases so a
    wrong offset or a dropped bias shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "norm" in name:
                p.copy_(
                    torch.rand(p.shape, generator=gen) * 0.8 + (0.6 if p.mean() > 0.5 else -0.4)
                )
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def make_tiny(arch: str, path: Path, seed: int = 0, **overrides: Any) -> Any:
    """Save a tiny random model of `arch` into `path`; return the transformers model (fp32)."""
    import transformers as tf

    config = hf_config(arch, **overrides)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    model.eval()
    model.save_pretrained(path)
    save_tokenizer(make_word_tokenizer(), WORD_TOKENIZER_CONFIG, path)
    return model


LlamaTokenizer = Literal["chat", "sentencepiece"]
_LLAMA_TOKENIZERS = {
    "chat": (make_chat_tokenizer, CHAT_TOKENIZER_CONFIG),
    "sentencepiece": (make_sentencepiece_tokenizer, SP_TOKENIZER_CONFIG),
}


def make_tiny_llama(
    path: Path, tokenizer: LlamaTokenizer = "chat", seed: int = 0, max_positions: int = 512
) -> Path:
    """A random-weight Llama (hidden 64, 2 layers, a context of `max_positions`): config.json,
    model.safetensors and the tokenizer files in `path`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    make, tok_config = _LLAMA_TOKENIZERS[tokenizer]
    tok = make()
    save_tokenizer(tok, tok_config, path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        **_special_ids(tok, tok_config),
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def _special_ids(tok: Tokenizer, tok_config: dict[str, Any]) -> dict[str, int]:
    keys = ("bos_token", "eos_token", "pad_token")
    return {f"{k}_id": tok.token_to_id(tok_config[k]) for k in keys if k in tok_config}


def prompts(n: int = 4, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [3, 9, 17, 30, 5, 12, 21, 40][:n]
    return [[1] + torch.randint(4, VOCAB, (k - 1,), generator=gen).tolist() for k in lengths]


def hf_greedy(model: Any, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new,
            min_new_tokens=0,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
