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
        self.dtype, self.device = dtype, device
        self.shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        self.storage: dict[str, torch.Tensor] = {}
        self.filled: set[tuple[str, int | None]] = set()
        self.tied = getattr(getattr(model, "args", None), "tie_word_embeddings", False)

    def add(self, hf_name: str, tensor: torch.Tensor, source: str) -> None:
        if hf_name.endswith(IGNORED_SUFFIXES) or (self.tied and hf_name == "lm_head.weight"):
            return
        name, part = target_of(hf_name)
        if name not in self.shapes:
            raise ModelLoadError(f"{source}: unexpected tensor {hf_name!r} for this architecture")
        expected = self.shapes[name]
        if part is not None:
            module = self.model.get_submodule(name.rsplit(".", 1)[0])
            assert isinstance(module, MergedLinear)
            rows = module.shard_slice(part)
            expected = (rows.stop - rows.start, *expected[1:])
        if tuple(tensor.shape) != expected:
            raise ModelLoadError(
                f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {expected}"
            )
        if part is None:  # the loaded tensor becomes the parameter: no second copy
            self.storage[name] = tensor.to(device=self.device, dtype=self.dtype).contiguous()
        else:
            if name not in self.storage:
                self.storage[name] = torch.empty(
                    self.shapes[name], dtype=self.dtype, device=self.device
                )
            self.storage[name][rows].copy_(tensor)
        self.filled.add((name, part))

    def finish(self) -> None:
        """Check nothing is missing, then swap the meta parameters for the loaded ones."""
        missing = [hf for name in self.shapes for hf in self._missing(name)]
        if missing:
            shown = ", ".join(missing[:8]) + (
                f" ... ({len(missing) - 8} more)" if len(missing) > 8 else ""
            )
            raise ModelLoadError(f"missing tensors: {shown}")
        for name, tensor in self.storage.items():
            owner, _, leaf = name.rpartition(".")
            param = nn.Parameter(tensor, requires_grad=False)
            setattr(self.model.get_submodule(owner), leaf, param)

    def _missing(self, name: str) -> list[str]:
        """HF names of the parts of parameter `name` that no tensor filled."""
        module = self.model.get_submodule(name.rsplit(".", 1)[0])
        parts = part_names(name, module)
        if len(parts) > 1:
            return [hf for i, hf in enumerate(parts) if (name, i) not in self.filled]
        return [] if (name, None) in self.filled else [name]


_PART_NAMES = {target: hf for hf, target in STACKED.items()}


def part_names(name: str, module: nn.Module) -> list[str]:
    """The HF names of the tensors that parameter `name` of `module` is made of, in order."""
    if isinstance(module, MergedLinear) and len(module.out_sizes) > 1:
        merged = name.split(".")[-2]
        return [
            name.replace(f".{merged}.", f".{_PART_NAMES[(merged, i)]}.")
            for i in range(len(module.out_sizes))
        ]
    return [name]
