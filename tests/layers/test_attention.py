"""Paged attention against dense causal attention, on scattered blocks, with GQA and windows;
chunks over cached blocks gathered, or read in place by the Triton kernel (through Triton's
interpreter on the CPU)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from kernels.on_triton import ON_GPU  # first: the interpreter, where there is no GPU

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.kernels.paged_decode import supported
from headrace.layers.attention import paged_attention
from headrace.request import SamplingParams

HQ, HKV, D, BS, NUM_BLOCKS = 4, 2, 8, 4, 64
SCALE = D**-0.5


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """q [n, Hq, D], k/v [n, Hkv, D] of one whole sequence -> [n, Hq * D]."""
    n = q.shape[0]
    pos = torch.arange(n)
    mask = pos[None, :] <= pos[:, None]
    if window is not None:
        mask &= pos[None, :] > pos[:, None] - window
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=SCALE
    )
    return o.transpose(0, 1).flatten(1)


@pytest.mark.parametrize("in_place", [False, True], ids=["gathered-chunks", "in-place-chunks"])
@pytest.mark.parametrize("paged_kernel", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("window", [None, 5])
def test_chunks_and_decodes_match_dense(
    window: int | None, paged_kernel: bool, in_place: bool
) -> None:
    if paged_kernel and not supported(torch.device("cpu"), torch.float32):
        pytest.skip("no C compiler: CPU kernels unavailable")
    if in_place:
        pytest.importorskip("triton")
        if ON_GPU:  # CPU tensors need the interpreter, which a GPU machine does not set
            pytest.skip("tested on the device by tests/kernels/test_paged_prefill_triton.py")
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    lengths = [1, 6, 13, 20]
    seqs = [
        (
            torch.randn(n, HQ, D, generator=gen),
            torch.randn(n, HKV, D, generator=gen),
            torch.randn(n, HKV, D, generator=gen),
        )
        for n in lengths
    ]
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)  # scattered, out-of-order blocks
    tables = [[free.pop() for _ in range(-(-n // BS))] for n in lengths]
    k_cache = torch.zeros(NUM_BLOCKS, BS, HKV, D)
    v_cache = torch.zeros(NUM_BLOCKS, BS, HKV, D)
    outs: list[list[torch.Tensor]] = [[] for _ in lengths]
    done = [0] * len(lengths)
    chunk_sizes = [1, 3, 1, 7, 2, 5]
    step = 0
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        sched = []
        for i, n in enumerate(lengths):
            size = min(chunk_sizes[(step + i) % len(chunk_sizes)], n - done[i])
            if size:
                ids = list(range(size))
                sched.append(
                    ScheduledRequest(str(i), ids, done[i], tables[i], True, SamplingParams(), 0)
                )
        # both windows' views in one step, as for Gemma's layers: the kernel's one table
        inputs = build_step_inputs(
            sched, BS, [5, None], torch.device("cpu"), paged_kernel=paged_kernel,
            paged_prefill=in_place,
        )  # fmt: skip
        views = [v for c in inputs.meta.prefills for v in c.views.values()]
        assert all((v.mask is None) == in_place for v in views)
        order = [int(r.request_id) for r in inputs.sampled]  # the batch's row order
        rows = [
            (i, done[i], done[i] + len(r.token_ids))
            for i, r in zip(order, inputs.sampled, strict=True)
        ]
        q = torch.cat([seqs[i][0][a:b] for i, a, b in rows])
        k = torch.cat([seqs[i][1][a:b] for i, a, b in rows])
        v = torch.cat([seqs[i][2][a:b] for i, a, b in rows])
        out = paged_attention(q, k, v, k_cache, v_cache, inputs.meta, SCALE, window)
        start = 0
        for i, a, b in rows:
            outs[i].append(out[start : start + b - a])
            start += b - a
            done[i] = b
        step += 1
    for (q, k, v), pieces in zip(seqs, outs, strict=True):
        torch.testing.assert_close(torch.cat(pieces), dense(q, k, v, window))
