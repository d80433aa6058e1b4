"""The in-place paged decode kernel against gather + SDPA, on every path of the C code:
the AVX-512 one (G in 1, 2, 4, 8 and D a multiple of 16: the weighted sum in passes of four
column chunks and a tail of single ones) and the portable one (any other)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headrace.kernels.paged_decode import paged_decode, supported

pytestmark = pytest.mark.skipif(
    not supported(torch.device("cpu"), torch.float32), reason="no C compiler: kernels off"
)
BS = 16


def reference(
    q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: list[list[int]], spans: list
) -> torch.Tensor:
    """Per sequence: gather its blocks, keep positions [lo, hi), SDPA in float64."""
    b, hq, d = q.shape
    hkv = kc.shape[2]
    out = torch.empty(b, hq, d, dtype=torch.float64)
    for i, (table, (base, lo, hi)) in enumerate(zip(tables, spans, strict=True)):
        keys = kc[table].reshape(-1, hkv, d)[lo - base : hi - base].double()  # [n, Hkv, D]
        vals = vc[table].reshape(-1, hkv, d)[lo - base : hi - base].double()
        keys = keys.repeat_interleave(hq // hkv, 1).transpose(0, 1)  # [Hq, n, D]
        vals = vals.repeat_interleave(hq // hkv, 1).transpose(0, 1)
        qi = q[i].double()[:, None, :]  # [Hq, 1, D]
        out[i] = F.scaled_dot_product_attention(qi, keys, vals, scale=d**-0.5)[:, 0]
    return out


Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_case(
    hq: int, hkv: int, d: int, dtype: torch.dtype, bs: int = BS
) -> tuple[Case, torch.Tensor]:
    """Six sequences over scattered blocks: one slot, partial, exactly a block, block + 1,
    and two under a window (their tables start a block or two in, their spans later still).
    Returns (q, k_cache, v_cache, padded table, bounds) and the float64 reference."""
    gen = torch.Generator().manual_seed(hq * 1000 + d + bs)
    lengths = [1, 5, bs, bs + 1, 2 * bs + 8, 300]
    nb = [-(-n // bs) for n in lengths]
    pool = sum(nb) + 3
    kc = torch.randn(pool, bs, hkv, d, generator=gen).to(dtype)
    vc = torch.randn(pool, bs, hkv, d, generator=gen).to(dtype)
    order = torch.randperm(pool, generator=gen).tolist()  # scattered blocks
    tables = []
    for n in nb:
        tables.append(order[:n])
        order = order[n:]
    spans = [(0, 0, n) for n in lengths]
    spans[4] = (bs, bs + 3, lengths[4])
    tables[4] = tables[4][1:]
    spans[5] = (2 * bs, 250, 300)
    tables[5] = tables[5][2:]
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    bounds = torch.tensor(spans).t().contiguous()
    q = torch.randn(len(lengths), hq, d, generator=gen).to(dtype)
    return (q, kc, vc, padded, bounds), reference(q, kc, vc, tables, spans)


SHAPES = [
    (4, 1, 256),
    (8, 2, 64),
    (2, 2, 32),
    (16, 2, 128),
    (4, 2, 80),
    (6, 2, 64),
    (4, 2, 24),
    (3, 3, 8),
]
SHAPE_IDS = [
    "gemma3",
    "gqa4",
    "mha",
    "g8",
    "d80-tail",
    "g3-portable",
    "d24-portable",
    "tiny-portable",
]


@pytest.mark.parametrize(("hq", "hkv", "d"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_matches_gathered_sdpa(hq: int, hkv: int, d: int, dtype: torch.dtype) -> None:
    (q, kc, vc, padded, bounds), want = make_case(hq, hkv, d, dtype)
    got = paged_decode(q, kc, vc, padded, bounds, d**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


def test_non_contiguous_query_is_read_right() -> None:
    """The model hands the kernel a slice of the fused qkv output."""
    gen = torch.Generator().manual_seed(1)
    kc = torch.randn(4, BS, 1, 32, generator=gen)
    vc = torch.randn(4, BS, 1, 32, generator=gen)
    qkv = torch.randn(3, 6, 32, generator=gen)
    q = qkv[:, :4]  # [3, 4, 32], not contiguous
    table = torch.tensor([[0, 1], [2, 0], [3, 0]])
    bounds = torch.tensor([[0, 0, 0], [0, 0, 0], [20, 9, 1]])
    got = paged_decode(q, kc, vc, table, bounds, 0.2)
    want = paged_decode(q.contiguous(), kc, vc, table, bounds, 0.2)
    assert torch.equal(got, want)
