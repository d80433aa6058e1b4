"""GGUF conversion on tiny files written like llama.cpp writes them: Q8_0 dequantization,
Gemma's w + 1 norms, Llama's q/k permutation, name mapping, the cache directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from factories import GGUF_GEMMA3, hf_greedy, make_tiny, permute, prompts, write_tiny_gguf

from headrace.config import CacheConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.loader.cache import COMPLETE, converted_dir
from headrace.loader.errors import ModelLoadError
from headrace.loader.gguf import dequantize_f32, hf_name, open_gguf, unpermute
from headrace.loader.hf import load_model
from headrace.loader.tokenizer import load_tokenizer


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert np.array_equal(unpermute(permute(w, 8), 8), w)
    assert not np.array_equal(permute(w, 8), w)


def test_q8_0_dequantizes_exactly_as_gguf_does() -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    gen = np.random.default_rng(0)
    w = (gen.standard_normal((6, 96)) * np.logspace(-3, 2, 96)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType.Q8_0)  # [6, 3 * 34] bytes
    ours = dequantize_f32(raw, GGMLQuantizationType.Q8_0)
    assert ours.dtype == np.float32 and ours.shape == (6, 96)
    assert np.array_equal(ours, dequantize(raw, GGMLQuantizationType.Q8_0))
    assert np.abs(ours - w).max() < np.abs(w).max() / 100  # it is w, quantized


def test_the_reader_reads_fields_and_tensors_of_a_file(tmp_path: Path) -> None:
    hf_model = make_tiny("llama", tmp_path / "hf")
    write_tiny_gguf(hf_model, "llama", tmp_path / "m.gguf")
    reader = open_gguf(tmp_path / "m.gguf")
    assert str(reader.fields["general.architecture"].contents()) == "llama"
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == hf_model.config.vocab_size
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    values = dequantize_f32(np.asarray(embd.data), embd.tensor_type)
    want = hf_model.model.embed_tokens.weight.detach().numpy()  # rounded like Q8_0 by the writer
    assert np.array_equal(values, want)


def test_names() -> None:
    assert hf_name("token_embd.weight", "gemma3") == "model.embed_tokens.weight"
    assert (
        hf_name("blk.3.ffn_norm.weight", "gemma3")
        == "model.layers.3.pre_feedforward_layernorm.weight"
    )
    assert (
        hf_name("blk.3.ffn_norm.weight", "llama")
        == "model.layers.3.post_attention_layernorm.weight"
    )
    assert hf_name("blk.0.attn_q.bias", "qwen2") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_name("rope_freqs.weight", "llama") is None


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tiny_gguf_generates_like_transformers(arch: str, tmp_path: Path) -> None:
    hf_model = make_tiny(arch, tmp_path / "hf", **(GGUF_GEMMA3 if arch == "gemma3" else {}))
    gguf_path = tmp_path / f"tiny-{arch}.gguf"
    write_tiny_gguf(hf_model, arch, gguf_path)  # also rounds hf_model's embedding like Q8_0
    model_dir = converted_dir(gguf_path, root=tmp_path / "cache")
    assert (model_dir / COMPLETE).is_file()
    assert converted_dir(gguf_path, root=tmp_path / "cache") == model_dir  # reused
    model, _ = load_model(model_dir, torch.float32, torch.device("cpu"), 512)
    runner = ModelRunner.from_parts(model, model_dir, CacheConfig(block_size=8))
    ps = prompts(4)
    assert greedy(runner, ps, 16) == [hf_greedy(hf_model, p, 16) for p in ps]
    assert load_tokenizer(model_dir).encode("<eos>") == [
        2,
        1,
    ]  # BOS added, control token kept whole
    assert runner.eos_token_ids == (1,)


def test_not_a_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        converted_dir(bad, root=tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("bad-*"))
