"""CUDA's in-place prefill attention (a Triton kernel) for a chunk over cached blocks, against
float64 causal attention over the sequence's positions: on the GPU where there is one, else
through Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from kernels.on_triton import DEVICE

pytest.importorskip("triton")

from headrace.kernels.paged_prefill import reference  # noqa: E402
from headrace.kernels.paged_prefill_triton import paged_prefill_triton  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def make_case(
    hq: int, hkv: int, d: int, dtype: torch.dtype, start: int, n: int, bs: int = 16, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """A sequence of start + n positions in shuffled blocks (the pool's other blocks and the
    last block's unwritten slots are NaN: a kernel that reads them shows it); the chunk's
    queries are its last n positions. Returns q, k_cache, v_cache, block_table."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-(start + n) // bs)
    pool = 2 * nb + 1
    table = torch.randperm(pool, generator=gen)[:nb]
    kc = torch.full((pool, bs, hkv, d), float("nan"))
    vc = torch.full((pool, bs, hkv, d), float("nan"))
    kc[table] = torch.randn(nb, bs, hkv, d, generator=gen)
    vc[table] = torch.randn(nb, bs, hkv, d, generator=gen)
    tail = start + n - (nb - 1) * bs  # the last block's written slots; past them NaN too
    kc[table[-1], tail:] = float("nan")
    vc[table[-1], tail:] = float("nan")
    q = torch.randn(n, hq, d, generator=gen)
    return q.to(dtype), kc.to(dtype), vc.to(dtype), table


def expected(case: tuple[torch.Tensor, ...], start: int, window: int | None) -> torch.Tensor:
    q, kc, vc, table = case
    return reference(q.double(), kc.double(), vc.double(), table, start, window)


def run(case: tuple[torch.Tensor, ...], start: int, window: int | None) -> torch.Tensor:
    q, kc, vc, table = (t.to(DEVICE) for t in case)
    return paged_prefill_triton(q, kc, vc, table, start, window, q.shape[-1] ** -0.5).cpu()


@pytest.mark.parametrize(
    ("hq", "hkv", "d"), [(4, 1, 256), (8, 2, 64), (2, 2, 32), (6, 2, 80)],
    ids=["gemma3", "gqa4", "mha", "g3-d80"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_chunk_over_cached_blocks_matches_causal_attention(
    hq: int, hkv: int, d: int, dtype: torch.dtype
) -> None:
    # a chunk after 37 cached positions, longer than one tile of queries for every layout
    case = make_case(hq, hkv, d, dtype, start=37, n=70)
    got = run(case, 37, None)
    assert got.dtype == dtype and got.shape == case[0].shape
    want = expected(case, 37, None)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    ("start", "n", "window", "bs"),
    [(0, 40, 16, 16), (100, 50, 32, 16), (5, 3, 4, 1), (64, 65, 512, 8), (200, 17, 7, 5)],
    ids=["from-0-windowed", "past-window", "bs1", "window-wider", "odd-block"],
)
def test_windows_and_block_sizes(start: int, n: int, window: int, bs: int) -> None:
    case = make_case(4, 2, 32, torch.float32, start, n, bs)
    want = expected(case, start, window)
    got = run(case, start, window)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
