"""Gated MLP activations: `act(gate) * up` on a merged `[gate | up]` projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def gated(act: Callable[[torch.Tensor], torch.Tensor], gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 * I] -> [T, I]: act(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return act(gate) * up
