"""Small host values on the device: the right values and dtype everywhere, and on CUDA a copy
that does not wait for the kernels queued before it."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels.host_copy import to_device


def test_values_and_dtypes_on_the_cpu() -> None:
    cpu = torch.device("cpu")
    ids = to_device([3, 1, 2], cpu, torch.int64)
    assert ids.dtype == torch.int64 and ids.tolist() == [3, 1, 2]
    temps = to_device([0.5, 1.25], cpu, torch.float32)
    assert temps.dtype == torch.float32 and temps.tolist() == [0.5, 1.25]
    flags = to_device([True, False], cpu, torch.bool)
    assert flags.dtype == torch.bool and flags.tolist() == [True, False]
    mask = torch.tensor([[True, False]])
    assert torch.equal(to_device(mask, cpu), mask)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_copy_is_queued_behind_running_work() -> None:
    cuda = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time, queued
    got = to_device([7, 8, 9], cuda, torch.int64)
    # a blocking copy would have waited for the sleep: the stream would be idle by now
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert got.is_cuda and got.cpu().tolist() == [7, 8, 9]
