"""The oneDNN linear path: packed weights and row bucketing; int8 in steps with LoRA rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headrace.layers.linear import MergedLinear, bucket_rows, pack_weight, packed_linear
from headrace.layers.lora import LoraBatch, LoraDelta


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


def test_a_step_with_adapter_rows_keeps_bf16_unless_int8_is_asked_for() -> None:
    """Under `--int8-matmuls auto` int8 fails the quality gate with a LoRA adapter, so a step
    with adapter rows takes bf16 (the same as int8 off); `on` keeps int8 in those steps too."""
    linear = MergedLinear(640, [128]).to(torch.bfloat16)
    torch.nn.init.normal_(linear.weight, std=0.05)
    linear.pack()
    if not linear.quantize():
        pytest.skip("no int8 matmuls here (bf16 on a CPU with VNNI/AMX)")
    x = torch.randn(40, 640).to(torch.bfloat16)  # past the int8 threshold
    int8_out = linear(x)
    int8, linear.int8 = linear.int8, None
    bf16_out = linear(x)  # as with --int8-matmuls off
    linear.int8 = int8
    assert not torch.equal(int8_out, bf16_out)  # the two paths differ: the test can tell them
    batch = LoraBatch()
    linear.lora = LoraDelta(batch)  # an adapter targets it, but none runs in this step
    assert torch.equal(linear(x), int8_out)
    batch.groups = [(1, slice(0, 3))]  # rows 0-2 run an adapter without weights here
    assert torch.equal(linear(x), bf16_out)
    linear.int8_with_lora = True
    assert torch.equal(linear(x), int8_out)
