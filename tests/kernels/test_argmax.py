"""The greedy argmax kernel gives torch.argmax's answer: first index of the max, NaN wins."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels.argmax import argmax_rows
from headrace.kernels.build import cpu_kernels

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="no C compiler: kernels off")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab", [1, 7, 1024, 1025, 262144])
def test_random_rows(dtype: torch.dtype, vocab: int) -> None:
    x = torch.randn(9, vocab, generator=torch.Generator().manual_seed(vocab)).to(dtype)
    assert torch.equal(argmax_rows(x), x.float().argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ties_infinities_and_nan(dtype: torch.dtype) -> None:
    v = 3000
    x = torch.zeros(6, v)
    x[0, [5, 2000, 2999]] = 4.0  # ties across blocks: the first
    x[1] = float("-inf")  # all -inf: index 0, as torch
    x[2, 1500] = float("inf")
    x[3, [10, 2500]] = float("nan")  # NaN is the max: the first NaN
    x[3, 5] = 9.0
    x[4, 1023], x[4, 1024] = 2.0, 2.0  # a tie on the block edge
    x[5] = -1.0
    x[5, 2048] = -0.5  # the max in a later block than all-equal earlier ones
    x = x.to(dtype)
    assert argmax_rows(x).tolist() == x.float().argmax(dim=-1).tolist()


def test_non_contiguous_rows() -> None:
    x = torch.randn(8, 4096, generator=torch.Generator().manual_seed(3))
    rows = x[::2]
    assert torch.equal(argmax_rows(rows), rows.argmax(dim=-1))
