"""The oneDNN linear path: packed weights and row bucketing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headrace.layers.linear import bucket_rows, pack_weight, packed_linear


def test_bucket_rows_bounds_waste_and_shapes() -> None:
    buckets = [bucket_rows(n) for n in range(1, 2049)]
    assert buckets[:32] == list(range(1, 33))  # decode batches stay exact
    for n, b in enumerate(buckets, start=1):
        assert n <= b <= n + n / 16, (n, b)
        assert bucket_rows(b) == b  # a bucket is its own bucket: padding never grows twice
    assert buckets == sorted(buckets)
    # 32 exact sizes, then 16 per power of two: the primitives of 4-5 weights stay well under
    # oneDNN's cache of 1,024 for any step budget up to 2,048 tokens
    assert len(set(buckets)) <= 32 + 16 * 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 31, 33, 100, 301, 513])
def test_padded_rows_compute_the_same_as_unpadded(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    packed = pack_weight(weight)
    if packed is None:
        pytest.skip("oneDNN weight packing is not available in this build")
    x = torch.randn(rows, 64, generator=gen).to(dtype)
    got = packed_linear(x, packed, bias)
    assert got.shape == (rows, 96)
    want = F.linear(x.float(), weight.float(), bias.float())
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
