"""Triton kernels in the tests: on the GPU where there is one, else through Triton's
interpreter on the CPU, which runs the same kernel program element by element. Import this
before any kernel module: the interpreter is chosen when a kernel is decorated."""

from __future__ import annotations

import os

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
