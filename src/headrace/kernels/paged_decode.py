"""Decode attention that reads the paged KV cache in place: the C kernel in cpu_kernels.c on
the CPU, a Triton kernel on CUDA (paged_decode_triton.py).

The torch path (layers/attention.py) gathers every sequence's blocks into a padded copy per
layer and runs SDPA over it: at batch 32, context 300 that is about a third of a Gemma 3 270M
decode step on this CPU. The kernel reads each cached K/V row once, where it lies, and only up
to each sequence's own length: no copy, no padding, no mask.

Shapes (one layer, one step): q [B, Hq, D]; k_cache, v_cache [N, bs, Hkv, D];
bounds [3, B] int64 = (base, lo, hi): block_table[b, 0] holds position base[b], and sequence b
attends to positions [lo[b], hi[b]). Output [B, Hq, D] in q's dtype. Benchmark: bench/kernels.py
(CPU), bench/gpu/device_bench.py (CUDA).

On CUDA the Triton kernel is taken where Triton imports and a small probe matches a float64
reference on the device (checked once per device, dtype and model shape: a GPU or Triton build
that compiles it wrong falls back to the gathered path with a warning, never to wrong numbers).
Its launches go to the current CUDA device, which the runner sets to its own at start.
`HEADRACE_TRITON_DECODE=0` keeps the gathered path (the baseline the GPU bench compares).
"""

from __future__ import annotations

import logging

import torch

from headrace.kernels.build import cpu_kernels
from headrace.kernels.triton_probe import taken_on_cuda

log = logging.getLogger(__name__)
_NAMES = {torch.bfloat16: "paged_decode_bf16", torch.float32: "paged_decode_f32"}


# (query heads, KV heads, head dim, block size): the probe's shape where the caller gives none
PROBE_SHAPE = (8, 2, 64, 16)


def supported(
    device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int] = PROBE_SHAPE
) -> bool:
    """Whether decode attention reads the cache in place here; on CUDA, probed once per
    device, dtype and `shape` (Triton compiles the kernel for each)."""
    if device.type == "cpu":
        return dtype in _NAMES and cpu_kernels() is not None
    return taken_on_cuda("HEADRACE_TRITON_DECODE", device, dtype, shape, _probe)


def _probe(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> bool:
    """The Triton kernel on two sequences of `shape` (three blocks each, one partial, one
    starting mid-table), whole and split into spans, against `reference` (float64)."""
    try:
        from headrace.kernels.paged_decode_triton import paged_decode_triton
    except ImportError as e:
        log.info("no Triton (%s): decode attention gathers the cache on %s", e, device)
        return False
    hq, hkv, d, bs = shape
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(6, bs, hkv, d, generator=gen)
    vc = torch.randn(6, bs, hkv, d, generator=gen)
    q = torch.randn(2, hq, d, generator=gen)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]])
    bounds = torch.tensor([[0, bs], [0, bs + 1], [2 * bs + 1, 4 * bs - 1]])
    scale = d**-0.5
    want = reference(q.double(), kc.double(), vc.double(), table, bounds, scale)
    try:
        qd, kd, vd = (t.to(device, dtype) for t in (q, kc, vc))
        ok = True
        for splits in (1, 3):  # a batch that fills the device, and one cut into spans
            got = paged_decode_triton(
                qd, kd, vd, table.to(device), bounds.to(device), scale, splits
            )
            ok = ok and torch.allclose(got.double().cpu(), want, atol=3e-2, rtol=3e-2)
    except Exception as e:  # a compiler or launch failure: the gathered path still serves
        log.warning("Triton decode attention failed on %s (%s): gathering the cache", device, e)
        return False
    if not ok:
        log.warning("Triton decode attention differs on %s %s: gathering the cache", device, dtype)
    return ok


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    bounds: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The same attention, one sequence at a time through gathered blocks (slow, any dtype)."""
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    out = torch.empty_like(q)
    for i in range(b):
        base, lo, hi = (int(x) for x in bounds[:, i])
        blocks = block_table[i, : -(-(hi - base) // bs)]
        keys = k_cache[blocks].reshape(-1, hkv, d)[lo - base : hi - base]  # [n, Hkv, D]
        vals = v_cache[blocks].reshape(-1, hkv, d)[lo - base : hi - base]
        keys = keys.repeat_interleave(hq // hkv, 1).transpose(0, 1)  # [Hq, n, D]
        vals = vals.repeat_interleave(hq // hkv, 1).transpose(0, 1)
        probs = torch.softmax((keys @ q[i][:, :, None]).squeeze(-1) * scale, -1)  # [Hq, n]
        out[i] = (probs[:, None, :] @ vals).squeeze(1)
    return out


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    bounds: torch.Tensor,
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:
    """`splits`: the GPU kernel's spans a sequence (None: its own choice; the CPU's kernel
    takes a sequence whole)."""
    # Long only for the C kernel's flat argument list (15 values), one a line.
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    assert q.dtype == k_cache.dtype == v_cache.dtype and hq % hkv == 0
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    assert block_table.dtype == bounds.dtype == torch.int64 and bounds.shape == (3, b)
    q, table, bounds = q.contiguous(), block_table.contiguous(), bounds.contiguous()
    if q.device.type != "cpu":
        from headrace.kernels.paged_decode_triton import paged_decode_triton

        return paged_decode_triton(q, k_cache, v_cache, table, bounds, scale, splits)
    lib = cpu_kernels()
    assert lib is not None
    out = torch.empty_like(q)
    failed = getattr(lib, _NAMES[q.dtype])(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        table.data_ptr(),
        table.shape[1],
        bounds[0].data_ptr(),
        bounds[1].data_ptr(),
        bounds[2].data_ptr(),
        b,
        hq,
        hkv,
        d,
        bs,
        scale,
        out.data_ptr(),
    )
    if failed:
        raise MemoryError("paged decode attention: out of memory for its score buffers")
    return out
