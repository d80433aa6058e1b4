"""Whether a Triton kernel serves a device, dtype and model shape: on CUDA only, unless its
environment flag is "0", and where its start-up probe against a float64 reference passed
(once per kernel, device, dtype and shape: Triton compiles for each). A GPU or Triton build
that compiles a kernel wrong falls back to the torch path, never to wrong numbers."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

Shape = tuple[int, int, int, int]  # (query heads, KV heads, head dim, block size)
Probe = Callable[[torch.device, torch.dtype, Shape], bool]
_GPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_probed: dict[tuple[str, str, torch.dtype, Shape], bool] = {}


def taken_on_cuda(
    flag: str, device: torch.device, dtype: torch.dtype, shape: Shape, probe: Probe
) -> bool:
    if device.type != "cuda" or dtype not in _GPU_DTYPES:
        return False
    if os.environ.get(flag, "1") == "0":
        return False
    key = (flag, str(device), dtype, shape)
    if key not in _probed:
        _probed[key] = probe(device, dtype, shape)
    return _probed[key]
