"""Tiny random-weight Hugging Face checkpoints made with transformers' own config classes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 512
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


def write_tokenizer(path: Path) -> None:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": True,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def make_tiny(arch: str, path: Path, seed: int = 0, **overrides: Any) -> Any:
    """Save a tiny random model of `arch` into `path`; return the transformers model (fp32)."""
    import transformers as tf

    config = hf_config(arch, **overrides)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    model.eval()
    model.save_pretrained(path)
    write_tokenizer(path)
    return model


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
