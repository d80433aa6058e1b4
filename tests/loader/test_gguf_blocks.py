"""A GGUF tensor's blocks as `scale * code + offset`: every value given back exactly, for every
supported type; a converted tiny GGUF keeps them beside its dense weights, the model's
projections take them, and a tied head its embedding's Q8_0."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import GGUF_GEMMA3, make_tiny, prompts, write_tiny_gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from safetensors import safe_open

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.kernels import block_linear, q8_head
from headrace.layers.linear import MergedLinear
from headrace.loader.blocks import attach_blocks
from headrace.loader.cache import converted_dir
from headrace.loader.gguf import dequantize_f32
from headrace.loader.gguf_blocks import LAYOUT, Blocks, block_form, q8_0_form
from headrace.loader.hf import BLOCKS_FILE, load_model

BITS = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q4_K: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q5_K: 5, Q.Q6_K: 6, Q.Q8_0: 8}
SUB_BLOCK = {**{kind: sub for kind, (_, _, sub) in LAYOUT.items()}, Q.Q8_0: 32}


def form_of(raw: np.ndarray, kind: Q, values: np.ndarray) -> Blocks | None:
    """A layer's block form, or Q8_0's (a tied head's, read from the bytes)."""
    return q8_0_form(raw, values.shape) if kind == Q.Q8_0 else block_form(raw, kind, values)


def random_k_quant(kind: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw K-quant rows (gguf-py cannot quantize these): random codes and scales, fp16
    headers of a weight's sizes."""
    size, per_block, _ = LAYOUT[kind]
    raw = rng.integers(0, 256, (rows * cols // per_block, size), dtype=np.uint8)
    fp16 = lambda n: (rng.standard_normal((n, 1)) * 1e-2).astype(np.float16).view(np.uint8)  # noqa: E731
    for at in (0, 2) if kind != Q.Q6_K else (208,):
        raw[:, at : at + 2] = fp16(len(raw))
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", list(SUB_BLOCK))
def test_every_value_comes_back_exactly(kind: Q) -> None:
    rng = np.random.default_rng(int(kind))
    if kind in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        raw = random_k_quant(kind, 8, 512, rng)
    else:
        raw = quantize(rng.standard_normal((8, 512)).astype(np.float32), kind)
    values = dequantize_f32(raw, kind)
    form = form_of(raw, kind, values)
    assert form is not None
    codes, scale, offset = form
    assert codes.shape == values.shape and scale.shape == offset.shape
    assert (
        int(codes.max()) < 1 << BITS[kind] and codes.shape[1] // scale.shape[1] == SUB_BLOCK[kind]
    )
    back = block_linear.dequantize(*(torch.from_numpy(a) for a in form))
    assert torch.equal(back, torch.from_numpy(values))


def test_types_without_the_form() -> None:
    data = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    raw = quantize(data, Q.Q8_0)  # signed 8-bit codes: past the layers' kernel's 7 bits
    assert block_form(raw, Q.Q8_0, dequantize_f32(raw, Q.Q8_0)) is None
    assert block_form(data, Q.F32, data) is None
    raw = quantize(data, Q.Q5_0)
    raw[0, :2] = np.array([np.nan], dtype=np.float16).view(np.uint8)  # a broken block header
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert block_form(raw, Q.Q5_0, dequantize_f32(raw, Q.Q5_0)) is None


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_converted_gguf_keeps_its_blocks_for_the_projections(arch: str, tmp_path: Path) -> None:
    hf_model = make_tiny(arch, tmp_path / "hf", **(GGUF_GEMMA3 if arch == "gemma3" else {}))
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(hf_model, arch, gguf_path, layers=Q.Q5_0)
    model_dir = converted_dir(gguf_path, root=tmp_path / "cache")
    model, _ = load_model(model_dir, torch.float32, torch.device("cpu"), 64)
    layers = hf_model.config.num_hidden_layers
    with safe_open(str(model_dir / BLOCKS_FILE), framework="pt") as f:
        names = sorted({k.rsplit(".", 1)[0] for k in f.keys()})  # noqa: SIM118
        tied = hf_model.config.tie_word_embeddings  # a tied head keeps its Q8_0 embedding's
        assert len(names) == 7 * layers + tied  # q k v o gate up down
        state = hf_model.state_dict()
        for name in names:  # the weights the dense file holds, q/k rows unpermuted too
            parts = (f.get_tensor(f"{name}.{p}") for p in ("codes", "scale", "offset"))
            assert torch.equal(block_linear.dequantize(*parts), state[name].float())
    if not block_linear.supported(64, 32, 32):
        pytest.skip("no AVX-512 BF16: the kernel cannot take the blocks here")
    model, _ = load_model(model_dir, torch.bfloat16, torch.device("cpu"), 64)
    assert attach_blocks(model, model_dir) == (4 * layers, 4 * layers)
    if hf_model.config.tie_word_embeddings:  # the head reads the embedding's Q8_0 blocks
        assert model.q8_head is not None
        embed = state["model.embed_tokens.weight"].double()
        x = torch.randn(3, model.args.hidden_size).bfloat16()
        exact = x.double() @ embed.t()
        slack = x.shape[1] * 2.0**-23 * (x.double().abs() @ embed.abs().t())
        assert ((q8_head.logits(x, model.q8_head).double() - exact).abs() <= slack).all()
        cap = model.args.final_logit_softcapping or 0.0
        want = torch.tanh(exact / cap) * cap if cap else exact
        assert torch.allclose(model.compute_logits(x).double(), want, atol=1e-4)
    mlp = model.get_submodule("model.layers.0.mlp.gate_up_proj")
    x = torch.randn(2, mlp.in_features).bfloat16()
    want = (
        x.double()
        @ torch.cat(
            [
                state["model.layers.0.mlp.gate_proj.weight"],
                state["model.layers.0.mlp.up_proj.weight"],
            ]
        )
        .double()
        .t()
    )
    assert torch.allclose(mlp(x).double(), want, rtol=2**-7, atol=1e-4)


@pytest.mark.skipif(not block_linear.supported(64, 32, 32), reason="no AVX-512 BF16")
def test_the_setting_takes_the_blocks_or_leaves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADRACE_CACHE", str(tmp_path / "cache"))
    hf_model = make_tiny("llama", tmp_path / "hf")
    write_tiny_gguf(hf_model, "llama", tmp_path / "tiny.gguf", layers=Q.Q4_0)
    taken, heads = {}, {}
    for setting in ("auto", "off"):
        config = ModelConfig(
            model=str(tmp_path / "tiny.gguf"), dtype="bfloat16", device="cpu", gguf_blocks=setting
        )
        runner = ModelRunner(config, CacheConfig(block_size=8, num_kv_blocks=64))
        taken[setting] = sum(
            m.blocks is not None for m in runner.model.modules() if isinstance(m, MergedLinear)
        )
        heads[setting] = runner.model.q8_head is not None
        assert greedy(runner, prompts(2), 8)  # and it generates
    assert taken == {"auto": 4 * hf_model.config.num_hidden_layers, "off": 0}
    tied = hf_model.config.tie_word_embeddings and q8_head.supported(16, 32)
    assert heads == {"auto": tied, "off": False}
    with pytest.raises(ValueError, match="gguf_blocks"):
        ModelConfig(gguf_blocks="on")
