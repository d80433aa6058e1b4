"""Put Hugging Face-named tensors into a model built on the meta device.

HF's `q_proj`/`k_proj`/`v_proj` and `gate_proj`/`up_proj` land in slices of our merged
`qkv_proj` / `gate_up_proj`; every other name maps one to one. Shapes are checked tensor by
tensor, and every parameter must be filled.
"""

from __future__ import annotations

import torch
from torch import nn

from headrace.layers.linear import MergedLinear
from headrace.loader.errors import ModelLoadError

STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def target_of(hf_name: str) -> tuple[str, int | None]:
    """HF tensor name -> (our parameter name, part index within a merged weight)."""
    parts = hf_name.split(".")
    for i, part in enumerate(parts):
        if part in STACKED:
            merged, index = STACKED[part]
            return ".".join([*parts[:i], merged, *parts[i + 1 :]]), index
    return hf_name, None


class WeightLoader:
    """Collects tensors into freshly allocated parameters of `dtype` on `device`."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
        self.model = model
        self.params = dict(model.named_parameters())
        self.storage = {
            name: torch.empty(p.shape, dtype=dtype, device=device)
            for name, p in self.params.items()
        }
        self.filled: set[tuple[str, int | None]] = set()
        self.tied = getattr(getattr(model, "args", None), "tie_word_embeddings", False)

    def add(self, hf_name: str, tensor: torch.Tensor, source: str) -> None:
        if hf_name.endswith(IGNORED_SUFFIXES) or (self.tied and hf_name == "lm_head.weight"):
            return
        name, part = target_of(hf_name)
        if name not in self.storage:
            raise ModelLoadError(f"{source}: unexpected tensor {hf_name!r} for this architecture")
        dest = self.storage[name]
        if part is not None:
            module = self.model.get_submodule(name.rsplit(".", 1)[0])
            assert isinstance(module, MergedLinear)
            dest = dest[module.shard_slice(part)]
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ModelLoadError(
                f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(dest.shape)}"
            )
        dest.copy_(tensor)
        self.filled.add((name, part))

    def finish(self) -> None:
        """Check nothing is missing, then swap the meta parameters for the loaded ones."""
        missing = [name for name in self.storage if not self._complete(name)]
        if missing:
            raise ModelLoadError(f"missing tensors: {', '.join(_hf_names(self.model, missing))}")
        for name, tensor in self.storage.items():
            owner, _, leaf = name.rpartition(".")
            setattr(
                self.model.get_submodule(owner), leaf, nn.Parameter(tensor, requires_grad=False)
            )

    def _complete(self, name: str) -> bool:
        module = self.model.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(module, MergedLinear) and len(module.out_sizes) > 1:
            return all((name, i) in self.filled for i in range(len(module.out_sizes)))
        return (name, None) in self.filled


def _hf_names(model: nn.Module, names: list[str]) -> list[str]:
    """Our parameter names back in HF spelling, for error messages."""
    reverse: dict[str, list[str]] = {}
    for hf_part, (merged, _) in STACKED.items():
        reverse.setdefault(merged, []).append(hf_part)
    out: list[str] = []
    for name in names:
        parts = name.split(".")
        hits = [p for p in parts if p in reverse]
        if hits:
            out.extend(name.replace(hits[0], h) for h in reverse[hits[0]])
        else:
            out.append(name)
    return out[:8] + ([f"... ({len(out) - 8} more)"] if len(out) > 8 else [])
