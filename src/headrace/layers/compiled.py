"""A layer's small ops fused by torch.compile on CUDA (`--torch-compile`, off by default).

On CUDA each elementwise op of a layer is its own kernel: RMSNorm's casts, square-mean and
products, the residual add, rotary's products and roll, act(gate) * up. A Gemma 3 layer runs
about 23 of them beside its 4 matmuls and its attention. Replayed in a CUDA graph they cost
the host nothing, but each still reads and writes a whole activation and keeps the device a
few µs, which at one stream is most of a step. Compiled (inductor, Triton on CUDA), each
group below is one kernel: a norm with its residual add, a rotation, a gated activation.

What is compiled is the eager path's own torch code (the functions passed to `run`), once per
shape family: torch's automatic dynamic shapes give one kernel for every token count past the
first two seen (and the one-token case its own); the decode graphs' warm-up compiles before
capture. Inductor's artifacts are cached on disk (torch's FX graph and Triton caches), so a
warm start does not compile again.

Numbers: inductor computes a fused chain in float32 and rounds once where the eager ops round
bf16 between steps, and its reductions sum in another order, so a compiled model's logits
differ from the eager ones within bf16 (fp32: within float32) rounding; the CPU keeps its own
fused C kernels (kernels/fused.py) and never compiles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

BACKEND = "inductor"  # the tests trace through "aot_eager" on the CPU (no code generated)
_enabled = False
_eager: set[Callable[..., torch.Tensor]] = set()  # past the recompile limit: eager from then on
log = logging.getLogger(__name__)


def enable(on: bool) -> None:
    """Compile the layers' small ops on CUDA from now on (the runner, from `--torch-compile`)."""
    global _enabled
    _enabled = on


def takes(x: torch.Tensor) -> bool:
    """Whether `x`'s op runs compiled: `--torch-compile` given, and `x` on CUDA."""
    return _enabled and x.is_cuda


def run(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """fn(*args), compiled (one graph, no breaks: a break would leave the ops unfused). A
    function past dynamo's limit of compiled variants runs eagerly from then on, with a
    warning, rather than failing the step."""
    if fn in _eager:
        return fn(*args)
    # here, not at the top: dynamo's import brings Triton, whose interpreter mode (the kernel
    # tests' on the CPU) is fixed when it is first imported
    from torch._dynamo.exc import FailOnRecompileLimitHit

    try:
        out: torch.Tensor = _compiled(fn, BACKEND)(*args)
    except FailOnRecompileLimitHit:
        log.warning("torch.compile: %s has too many shape variants; it runs eagerly", fn)
        _eager.add(fn)
        return fn(*args)
    return out


@cache
def _compiled(fn: Callable[..., torch.Tensor], backend: str) -> Callable[..., Any]:
    return torch.compile(fn, backend=backend, fullgraph=True)
