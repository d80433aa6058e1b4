"""Read a PEFT LoRA adapter: `adapter_config.json` + `adapter_model.safetensors`, no `peft`.

PEFT saves one pair per adapted projection, `...layers.3.self_attn.q_proj.lora_A.weight`
[r, in] and `...lora_B.weight` [out, r]; the forward adds `scaling * B(A(x))` with
`scaling = lora_alpha / r` (rsLoRA: `lora_alpha / sqrt(r)`). What this server cannot apply
exactly (DoRA, trained biases, per-module ranks or alphas, extra trained modules) is refused
with the reason rather than served wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors

from headrace.lora.names import LoraError, check_name

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The decoder's layers only (`model.layers.N`, a multimodal checkpoint's `language_model`):
# a vision tower's `encoder.layers.N.self_attn.q_proj` must not land on a text layer.
_KEY = re.compile(
    r"(?:^|\.)(?:model|language_model)\.layers\.(\d+)\.(?:self_attn|mlp)\.("
    + "|".join(PROJECTIONS)
    + r")\.lora_([AB])(?:\.default)?\.weight$"
)

Site = tuple[int, str]  # (layer index, Hugging Face projection name)


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float  # lora_alpha / r, or / sqrt(r) for rsLoRA
    weights: dict[Site, tuple[torch.Tensor, torch.Tensor]]  # A [r, in], B [out, r] (fp32)
    # sha256 of the very bytes parsed (config, then weights): a reload after an eviction
    # tells the same files from changed ones by it (manager.py), with no window between a
    # check and the read.
    digest: str = ""


def read_adapter(name: str, path: str | Path, max_rank: int) -> LoraAdapter:
    """The adapter in directory `path`; LoraError for anything missing, malformed or too big."""
    root = Path(path)
    digest = hashlib.sha256()
    cfg = _read_config(root / CONFIG, digest)
    rank, scaling = _rank_and_scaling(cfg, root / CONFIG, max_rank)
    weights = _read_weights(root / WEIGHTS, rank, digest)
    return LoraAdapter(check_name(name), str(root), rank, scaling, weights, digest.hexdigest())


def _read_config(path: Path, digest: hashlib._Hash) -> dict[str, Any]:
    try:
        data = path.read_bytes()
        digest.update(len(data).to_bytes(8, "little") + data)  # the length: where weights start
        cfg = json.loads(data.decode("utf-8"))
    except OSError as e:
        raise LoraError(f"{path}: cannot read the adapter config: {e.strerror}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoraError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise LoraError(f"{path}: expected a JSON object")
    return cfg


def _rank_and_scaling(cfg: dict[str, Any], path: Path, max_rank: int) -> tuple[int, float]:
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{path}: peft_type {cfg.get('peft_type')!r}; only LORA is served")
    refused = {
        "use_dora": "DoRA",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D weights)",
        "modules_to_save": "modules_to_save (fully trained extra modules)",
        "rank_pattern": "rank_pattern (per-module ranks)",
        "alpha_pattern": "alpha_pattern (per-module alphas)",
    }
    for key, what in refused.items():
        if cfg.get(key):
            raise LoraError(f"{path}: {what} is not supported")
    if cfg.get("bias", "none") != "none":
        raise LoraError(f"{path}: bias {cfg.get('bias')!r} is not supported (only 'none')")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if type(r) is not int or r < 1:
        raise LoraError(f"{path}: r must be a positive integer, got {r!r}")
    if r > max_rank:
        raise LoraError(f"{path}: rank {r} is above --max-lora-rank {max_rank}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise LoraError(f"{path}: lora_alpha must be a finite number, got {alpha!r}")
    rs = bool(cfg.get("use_rslora", False))
    return r, float(alpha) / (math.sqrt(r) if rs else r)


def _read_weights(
    path: Path, rank: int, digest: hashlib._Hash
) -> dict[Site, tuple[torch.Tensor, torch.Tensor]]:
    try:  # read whole, then parsed: the digest is of exactly what is served
        data = path.read_bytes()
        tensors = load_tensors(data)
    except Exception as e:  # a missing file, or safetensors' own error types
        raise LoraError(f"{path}: cannot read the adapter weights ({e})") from e
    digest.update(data)
    halves: dict[tuple[int, str, str], torch.Tensor] = {}
    for key, tensor in tensors.items():
        m = _KEY.search(key)
        if m is None:
            raise LoraError(f"{path}: tensor {key!r} is not a LoRA weight of {PROJECTIONS}")
        halves[(int(m[1]), m[2], m[3])] = tensor.float()
    return _pairs(halves, path, rank)


def _pairs(
    halves: dict[tuple[int, str, str], torch.Tensor], path: Path, rank: int
) -> dict[Site, tuple[torch.Tensor, torch.Tensor]]:
    sites = sorted({(layer, proj) for layer, proj, _ in halves})
    if not sites:
        raise LoraError(f"{path}: no LoRA weights")
    out: dict[Site, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer, proj in sites:
        a, b = halves.get((layer, proj, "A")), halves.get((layer, proj, "B"))
        where = f"{path}: layers.{layer}.{proj}"
        if a is None or b is None:
            raise LoraError(f"{where}: lora_A and lora_B must come in pairs")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise LoraError(
                f"{where}: shapes {tuple(a.shape)} and {tuple(b.shape)} do not match rank {rank}"
            )
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise LoraError(f"{where}: weights are not finite")
        out[(layer, proj)] = (a, b)
    return out
