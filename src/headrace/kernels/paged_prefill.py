"""Whether a prefill chunk over cached blocks reads them in place (the Triton kernel in
paged_prefill_triton.py, which the attention loads when it first takes it).

Only on CUDA: the CPU keeps the gathered path (layers/attention.py), where a chunk over a
cached head is rare enough (a prefix-cache hit, a prompt longer than a chunk) not to want a C
kernel. As for decodes (kernels/paged_decode.py), the kernel is taken only where Triton
imports and a probe with the model's heads, head size and block size matches a float64
reference on the device; `HEADRACE_TRITON_PREFILL=0` keeps the gathered path.

Shapes: q [n, Hq, D] of one chunk whose first query is at `start_pos`; k_cache, v_cache
[N, bs, Hkv, D]; block_table [nb] int64, the sequence's blocks from its first -> [n, Hq, D].
"""

from __future__ import annotations

import logging

import torch

from headrace.kernels.triton_probe import taken_on_cuda

log = logging.getLogger(__name__)


def supported(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> bool:
    """`shape`: (query heads, KV heads, head dim, block size); probed once per device, dtype
    and shape."""
    return taken_on_cuda("HEADRACE_TRITON_PREFILL", device, dtype, shape, _probe)


def _probe(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> bool:
    """A chunk of 20 queries after 23 cached positions, in shuffled blocks, full and with a
    window of 9, against float64 attention."""
    try:
        from headrace.kernels.paged_prefill_triton import paged_prefill_triton
    except ImportError as e:
        log.info("no Triton (%s): prefill over cached blocks gathers them on %s", e, device)
        return False
    hq, hkv, d, bs = shape
    start, n = 23, 20
    gen = torch.Generator().manual_seed(0)
    nb = -(-(start + n) // bs)
    table = torch.randperm(nb + 2, generator=gen)[:nb]
    kc = torch.randn(nb + 2, bs, hkv, d, generator=gen)
    vc = torch.randn(nb + 2, bs, hkv, d, generator=gen)
    q = torch.randn(n, hq, d, generator=gen)
    try:
        for window in (None, 9):
            want = reference(q.double(), kc.double(), vc.double(), table, start, window)
            qd, kd, vd = (t.to(device, dtype) for t in (q, kc, vc))
            got = paged_prefill_triton(qd, kd, vd, table.to(device), start, window, d**-0.5)
            if not torch.allclose(got.double().cpu(), want, atol=3e-2, rtol=3e-2):
                log.warning("Triton prefill differs on %s %s: gathering the cache", device, dtype)
                return False
    except Exception as e:  # a compiler or launch failure: the gathered path still serves
        log.warning("Triton prefill attention failed on %s (%s): gathering the cache", device, e)
        return False
    return True


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start_pos: int,
    window: int | None,
) -> torch.Tensor:
    """The same attention through the gathered blocks and an explicit mask (slow, any dtype)."""
    n, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    total = start_pos + n
    blocks = block_table[: -(-total // bs)]
    keys = k_cache[blocks].reshape(-1, hkv, d)[:total].repeat_interleave(hq // hkv, 1)
    vals = v_cache[blocks].reshape(-1, hkv, d)[:total].repeat_interleave(hq // hkv, 1)
    scores = q.transpose(0, 1) @ keys.permute(1, 2, 0) * d**-0.5  # [Hq, n, total]
    q_pos = torch.arange(start_pos, total)[:, None]
    k_pos = torch.arange(total)[None, :]
    seen = k_pos <= q_pos
    if window is not None:
        seen &= k_pos > q_pos - window
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)
    return (probs @ vals.transpose(0, 1)).transpose(0, 1)  # [n, Hq, D]
