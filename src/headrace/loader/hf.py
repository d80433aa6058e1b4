"""Load a Hugging Face model directory: config.json + *.safetensors (sharded too)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from headrace.loader.errors import ModelLoadError
from headrace.loader.files import read_json
from headrace.loader.weights import WeightLoader
from headrace.models.base import CausalLM
from headrace.models.registry import MODELS, architecture_of, model_class

log = logging.getLogger(__name__)
INDEX = "model.safetensors.index.json"
BLOCKS_FILE = "gguf_blocks.safetensors"  # a converted GGUF's quantized blocks (loader/gguf.py)


def read_config(model_dir: Path) -> dict[str, Any]:
    cfg = read_json(model_dir / "config.json", "config.json")
    if "text_config" in cfg and "vocab_size" not in cfg:
        raise ModelLoadError(
            f"{model_dir / 'config.json'}: multimodal checkpoints are not supported; "
            f"expected a text model, one of {sorted(MODELS)}"
        )
    return cfg


def resolve_class(cfg: dict[str, Any], source: Path) -> type[CausalLM]:
    arch = architecture_of(cfg)
    cls = model_class(arch)
    if cls is None:
        raise ModelLoadError(
            f"{source}: unsupported architecture {arch!r}; supported: {', '.join(sorted(MODELS))}"
        )
    return cls


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX
    if index.is_file():
        weight_map = read_json(index, "safetensors index").get("weight_map", {})
        files = sorted({model_dir / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{f}: missing shard named by {index}")
        return files
    files = sorted(p for p in model_dir.glob("*.safetensors") if p.name != BLOCKS_FILE)
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors weights found")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor, str]]:
    """(name, tensor, file) for every tensor; unreadable files raise ModelLoadError."""
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    yield name, f.get_tensor(name), str(path)
        except ModelLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types
            raise ModelLoadError(
                f"{path}: cannot read safetensors ({e}); the file may be truncated or corrupt"
            ) from e


def load_model(
    model_dir: Path, dtype: torch.dtype, device: torch.device, max_len: int
) -> tuple[CausalLM, dict[str, Any]]:
    """Build the model for `model_dir`, weights in `dtype` on `device`, rope up to `max_len`."""
    start = time.monotonic()
    cfg = read_config(model_dir)
    cls = resolve_class(cfg, model_dir / "config.json")
    try:
        args = cls.parse_config(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{model_dir / 'config.json'}: invalid config: {e!r}") from e
    with torch.device("meta"):
        model = cls(args)
    loader = WeightLoader(model, dtype, device)
    files = safetensors_files(model_dir)
    for i, path in enumerate(files):
        log.info("loading weights %d/%d: %s", i + 1, len(files), path.name)
        for name, tensor, source in iter_tensors([path]):
            loader.add(name, tensor, source)
    loader.finish()
    model.setup(min(max_len, args.max_position_embeddings), device)
    model.eval()
    log.info(
        "model %s loaded in %.1fs (%s, %s)",
        args.architecture,
        time.monotonic() - start,
        dtype,
        device,
    )
    return model, cfg
