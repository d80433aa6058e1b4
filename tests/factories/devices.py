"""The devices a real-model test runs on: the CPU always, CUDA where a GPU is present.

A test parametrized over `DEVICES` gains a CUDA leg that runs on a machine with a GPU and is
skipped (with the reason shown) elsewhere, so CI on CPU still runs every CPU leg.
"""

from __future__ import annotations

import pytest
import torch

NO_CUDA = not torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(NO_CUDA, reason="no CUDA"))]
