"""A step's integer inputs in one host buffer, moved to the device in one copy.

Every step builds its integer inputs from Python lists: token ids, positions, KV slots, the
sampled rows, the decodes' block table and bounds. One tensor per list, each moved on its
own, costs a host-to-device copy apiece from pageable memory on CUDA, and such a copy waits
for the stream (the driver stages pageable memory synchronously): about nine waits a step,
so the host could never run ahead of the device. Here the lists are written one after
another into one int64 host tensor, pinned on CUDA and sent with one `non_blocking` copy;
the step's tensors are views of that one device buffer. On the CPU the host tensor is the
buffer: no copy at all.

Shapes: each part is row-major with its given shape; parts start at even offsets (16 bytes),
so every view is aligned as a tensor of its own would be.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Sequence

import numpy as np
import torch

from headrace.kernels.host_copy import to_device


class Staging:
    """Collects int64 parts; `send` returns them as tensors on the device, in order."""

    def __init__(self) -> None:
        # an array, not a list: extended in C, and read by torch without a per-element copy
        # (at 256 decodes of 512 tokens, torch.tensor of a list took 0.7 ms of a 1.2 ms build)
        self._values = array("q")
        self._parts: list[tuple[int, tuple[int, ...]]] = []

    def add(self, values: Sequence[int], shape: tuple[int, ...]) -> int:
        """Queue `values` (math.prod(shape) of them, row-major); the part's index in `send`."""
        start = len(self._values)
        # struct.pack: 7 ns an int, against 30 for array.extend of a list (which converts and
        # appends one at a time); at 256 decodes a step stages ~1,800 ints
        self._values.frombytes(struct.pack(f"={len(values)}q", *values))
        return self._close(start, shape)

    def add_array(self, values: np.ndarray) -> int:
        """Queue an integer array as a part of its own shape (copied as int64, row-major)."""
        start = len(self._values)
        self._values.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
        return self._close(start, values.shape)

    def _close(self, start: int, shape: tuple[int, ...]) -> int:
        size = math.prod(shape)
        if len(self._values) - start != size:
            raise ValueError(f"{len(self._values) - start} values for shape {shape}")
        self._values.frombytes(bytes(8 * (size % 2)))  # the next part starts 16-byte aligned
        self._parts.append((start, shape))
        return len(self._parts) - 1

    def send(self, device: torch.device) -> list[torch.Tensor]:
        """Every part as a view of one int64 buffer on `device`."""
        if self._values:
            host = torch.frombuffer(self._values, dtype=torch.int64)  # shares the array
        else:
            host = torch.empty(0, dtype=torch.int64)
        buffer = to_device(host, device)  # on the CPU the same memory
        return [buffer[s : s + math.prod(shape)].view(shape) for s, shape in self._parts]
