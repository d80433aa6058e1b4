"""A small host value list (or CPU tensor) on the device without waiting for the device.

torch's blocking host-to-device copy synchronizes the stream: the host waits until every
kernel queued before it has run, then launches what follows while the device idles. The
sampler alone made five to eight such copies a sampled step on CUDA (row indices,
temperatures, uniforms, top_p goals), each one such wait. From pinned memory with
`non_blocking` the copy is queued behind the step's work like a kernel; torch's pinned-memory
cache keeps the block until the copy that reads it has run. Elsewhere (the CPU) a plain
tensor, no copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(
    values: torch.Tensor | Sequence[int] | Sequence[float] | Sequence[bool],
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`values` as a tensor on `device` (of `dtype`, where a list is given; else inferred).
    A CPU tensor that is pinned already is read by the copy as it is, not copied first: its
    caller must not change it until the device has read it."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
