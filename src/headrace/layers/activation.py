"""Gated MLP activations: `act(gate) * up` on a merged `[gate | up]` projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from headrace.kernels import fused
from headrace.layers import compiled


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


# activations with a fused `act(gate) * up` kernel for bf16 on the CPU (kernels/fused.py)
_FUSED = {_gelu_tanh: "gelu_tanh", F.silu: "silu"}


def gated(act: Callable[[torch.Tensor], torch.Tensor], gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 * I] -> [T, I]: act(gate) * up."""
    kind = _FUSED.get(act)
    if kind is not None and (out := fused.act_mul(gate_up, kind)) is not None:
        return out
    if compiled.takes(gate_up):  # CUDA with --compile: one kernel
        return compiled.run(_gated, act, gate_up)
    return _gated(act, gate_up)


def _gated(act: Callable[[torch.Tensor], torch.Tensor], gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return act(gate) * up
