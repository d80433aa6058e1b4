"""The KV pool's size and the running-request cap when not given: the CPU's fixed defaults,
CUDA's from the device's memory (vLLM's --gpu-memory-utilization) and 256 streams."""

from __future__ import annotations

import argparse

import pytest
import torch

from headrace.config import CacheConfig, SchedulerConfig, add_config_args, config_from_args
from headrace.engine.kv.kv_budget import GIB, WORK_RESERVE_GIB, cuda_kv_gib, kv_budget_gib


def test_the_cpu_keeps_one_gib_and_a_given_size_wins() -> None:
    assert kv_budget_gib(CacheConfig(), torch.device("cpu")) == 1.0
    assert kv_budget_gib(CacheConfig(kv_cache_memory_gb=3.5), torch.device("cpu")) == 3.5


def test_cuda_takes_what_the_utilization_leaves_after_the_weights() -> None:
    total = 141 * GIB
    own = 2 * GIB  # this process's weights
    got = cuda_kv_gib(own, total - own, total, 0.9)
    assert got == pytest.approx(0.9 * 141 - 2 - WORK_RESERVE_GIB)
    assert cuda_kv_gib(own, total - own, total, 0.5) == pytest.approx(0.5 * 141 - 4)


def test_replicas_sharing_a_device_count_their_own_memory_and_never_more_than_free() -> None:
    total = 80 * GIB
    # two replicas with a 0.45 share each; the other one's 30 GiB already allocated
    assert cuda_kv_gib(GIB, total - 31 * GIB, total, 0.45) == pytest.approx(36 - 1 - 2)
    # another process filled the device: what is free bounds the pool
    assert cuda_kv_gib(GIB, 10 * GIB, total, 0.9) == pytest.approx(10 - 2)


def test_cuda_without_room_says_which_flag_to_change() -> None:
    with pytest.raises(ValueError, match="gpu-memory-utilization 0.1 .*kv-cache-memory-gb"):
        cuda_kv_gib(7 * GIB, 70 * GIB, 80 * GIB, 0.1)


def test_max_num_seqs_defaults_by_device_and_a_given_one_wins() -> None:
    assert SchedulerConfig().for_device("cuda").max_num_seqs == 256
    assert SchedulerConfig().for_device("cpu").max_num_seqs == 64
    assert SchedulerConfig().seqs_limit == 64
    assert SchedulerConfig(max_num_seqs=8).for_device("cuda").max_num_seqs == 8


def _parse(argv: list[str]) -> tuple[CacheConfig, SchedulerConfig]:
    parser = argparse.ArgumentParser()
    add_config_args(parser, CacheConfig)
    add_config_args(parser, SchedulerConfig)
    args = parser.parse_args(argv)
    return config_from_args(CacheConfig, args), config_from_args(SchedulerConfig, args)


def test_the_flags_parse_and_bad_values_are_refused() -> None:
    cache, sched = _parse(["--max-num-seqs", "12", "--gpu-memory-utilization", "0.7"])
    assert sched.max_num_seqs == 12 and cache.gpu_memory_utilization == 0.7
    cache, sched = _parse([])
    assert cache.kv_cache_memory_gb is None and sched.max_num_seqs is None
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=1.5)
