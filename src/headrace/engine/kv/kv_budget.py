"""How much memory the paged KV pool gets when `--kv-cache-memory-gb` is not given.

On the CPU a fixed 1 GiB (the pool is calloc'd: untouched pages cost nothing). On CUDA, as
vLLM's `--gpu-memory-utilization`: the pool takes what that share of the device leaves once
this process's weights are in, less a reserve for a step's work (activations, a step's logits,
the CUDA context's growth), and never more than is free, so a GPU's memory holds hundreds of
streams' KV instead of 1 GiB's. Local replicas sharing a device split the share
(router/deploy.py), each counting only its own memory: they start in parallel.
"""

from __future__ import annotations

import torch

from headrace.config import CacheConfig

GIB = 1 << 30
CPU_KV_GIB = 1.0
WORK_RESERVE_GIB = 2.0


def kv_budget_gib(cache: CacheConfig, device: torch.device) -> float:
    if cache.kv_cache_memory_gb is not None:
        return cache.kv_cache_memory_gb
    if device.type != "cuda":
        return CPU_KV_GIB
    free, total = torch.cuda.mem_get_info(device)
    own = torch.cuda.memory_reserved(device)
    return cuda_kv_gib(own, free, total, cache.gpu_memory_utilization)


def cuda_kv_gib(own: int, free: int, total: int, utilization: float) -> float:
    """own: bytes this process holds (its weights); free, total: the device's -> GiB for the
    KV pool."""
    budget = min(utilization * total - own, free) - WORK_RESERVE_GIB * GIB
    if budget < 0.1 * GIB:
        raise ValueError(
            f"no device memory left for the KV cache: this process holds {own / GIB:.1f} GiB, "
            f"{free / GIB:.1f} of {total / GIB:.1f} GiB are free, --gpu-memory-utilization "
            f"{utilization:g} allows {utilization * total / GIB:.1f}, and "
            f"{WORK_RESERVE_GIB:.0f} GiB stay for a step's work; raise it or set "
            "--kv-cache-memory-gb"
        )
    return budget / GIB
