"""Convert a GGUF file into a dense Hugging Face directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) that `hf.load_model` then loads, plus the layer
weights' quantized blocks (BLOCKS_FILE, `gguf_blocks.py`) for decode steps that read them.

Tensors are dequantized with `gguf.quants.dequantize` to float32 and renamed to transformers'
names; llama.cpp's converter changes some on the way, which we undo as transformers does:
Gemma norms are stored as `w + 1` (we subtract 1), Llama's q/k rows are permuted for its
interleaved rope (we permute back).
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file

from headrace.loader.errors import ModelLoadError
from headrace.loader.gguf_blocks import Blocks, block_form, q8_0_form
from headrace.loader.gguf_config import hf_config
from headrace.loader.gguf_tokenizer import build_gguf_tokenizer
from headrace.loader.hf import BLOCKS_FILE  # name.codes / .scale / .offset per layer weight

log = logging.getLogger(__name__)

LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
GEMMA_LAYER_NAMES = {
    **LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
IGNORED = {"rope_freqs"}  # llama.cpp's precomputed llama3 factors; the config carries the scaling
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)\.(weight|bias)$")


class _Reader(GGUFReader):
    """GGUFReader parsing from a plain ndarray view of its memmap: numpy's memmap hooks on each
    of the ~3 million slices taken while reading a 262k-token vocabulary cost 14 of the 19 s
    the embedded Gemma's metadata took (5 s now). Tensors stay views of the mapped file."""

    def _build_fields(self, offs: int, count: int) -> int:
        self.data = self.data.view(np.ndarray)  # type: ignore[assignment]  # same buffer
        return super()._build_fields(offs, count)


def open_gguf(path: Path) -> GGUFReader:
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such GGUF file")
    try:
        return _Reader(str(path))
    except Exception as e:  # the reader raises ValueError, struct errors, ...
        raise ModelLoadError(f"{path}: cannot read GGUF ({e}); truncated or not a GGUF?") from e


def metadata(reader: GGUFReader) -> dict[str, Any]:
    return {key: field.contents() for key, field in reader.fields.items()}


def hf_name(gguf_name: str, arch: str) -> str | None:
    """GGUF tensor name -> transformers name (None: not a model weight we load)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{suffix}"
    m = _BLOCK.match(gguf_name)
    if m is None or m.group(2) in IGNORED:
        return None
    names = GEMMA_LAYER_NAMES if arch.startswith("gemma") else LAYER_NAMES
    part = names.get(m.group(2))
    return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved -> rotate-half rope layout)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def convert_tensor(name: str, data: np.ndarray, arch: str, cfg: dict[str, Any]) -> np.ndarray:
    if arch.startswith("gemma") and name.endswith("norm.weight"):
        data = data - 1  # stored as w + 1
    if arch == "llama" and ".self_attn.q_proj." in name:
        data = unpermute(data, cfg["num_attention_heads"])
    elif arch == "llama" and ".self_attn.k_proj." in name:
        data = unpermute(data, cfg["num_key_value_heads"])
    return data


Q8_0_BLOCK = 34  # bytes: an fp16 scale, then 32 int8 values


def dequantize_f32(raw: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """A tensor's values in float32. Q8_0 (the embedded Gemma's 262k x 640 embedding) in torch:
    8 s through gguf's numpy path, 0.5 s here; the same products (fp16 scale x int8, each
    exact in float32). Other types through gguf."""
    if kind != GGMLQuantizationType.Q8_0:
        return np.array(dequantize(raw, kind), dtype=np.float32)
    rows = raw.shape[:-1]
    blocks = torch.from_numpy(np.array(raw)).view(-1, Q8_0_BLOCK)  # a writable copy
    scale = blocks[:, :2].contiguous().view(torch.float16).float()
    values = blocks[:, 2:].contiguous().view(torch.int8).float() * scale
    return values.view(*rows, -1).numpy()


def _blocks_of(
    name: str, raw: np.ndarray, kind: GGMLQuantizationType, data: np.ndarray, tied: bool
) -> Blocks | None:
    """The blocks a decode step can read: the layers' projections' (kernels/block_linear.py;
    not Q8_0, whose 8-bit codes it cannot take) and a tied head's Q8_0 embedding
    (kernels/q8_head.py)."""
    if name == "model.embed_tokens.weight":
        q8 = tied and kind == GGMLQuantizationType.Q8_0 and raw.ndim == 2 and data.ndim == 2
        return q8_0_form(raw, data.shape) if q8 else None
    if name.startswith("model.layers.") and kind != GGMLQuantizationType.Q8_0:
        return block_form(raw, kind, data)
    return None


def convert_gguf(path: Path, out_dir: Path) -> None:
    """Write the HF directory for the GGUF at `path` into `out_dir` (which must exist)."""
    start = time.monotonic()
    log.info("converting %s (first start; later starts use the cache)", path.name)
    reader = open_gguf(path)
    meta = metadata(reader)
    arch = str(meta.get("general.architecture"))
    names = tuple(t.name for t in reader.tensors)
    cfg = hf_config(meta, names, str(path))
    tensors: dict[str, torch.Tensor] = {}
    blocks: dict[str, torch.Tensor] = {}
    total = len(reader.tensors)
    for i, t in enumerate(reader.tensors):
        name = hf_name(t.name, arch)
        if name is None:
            continue
        raw = np.asarray(t.data)
        try:
            data = dequantize_f32(raw, t.tensor_type)
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot dequantize tensor {t.name!r}: {e}") from e
        if form := _blocks_of(name, raw, t.tensor_type, data, "output.weight" not in names):
            for part, array in zip(("codes", "scale", "offset"), form, strict=True):
                array = convert_tensor(name, array, arch, cfg)  # the same rows as the weight
                blocks[f"{name}.{part}"] = torch.from_numpy(np.ascontiguousarray(array))
        data = convert_tensor(name, data, arch, cfg)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(data))
        if (i + 1) % max(1, total // 10) == 0 or i + 1 == total:
            log.info("dequantized %d/%d tensors", i + 1, total)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(blocks, str(out_dir / BLOCKS_FILE), metadata={"format": "pt"})
    tokenizer, tok_config = build_gguf_tokenizer(meta, str(path))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    log.info("converted %s in %.1fs", path.name, time.monotonic() - start)
