"""The KV pool reads as zeros before any step writes it (attention multiplies masked-out slots
by a zero weight, and 0 * NaN is NaN): from calloc on the CPU, one memset at start on a GPU,
and nothing a step has to do."""

from __future__ import annotations

import pytest
import torch

from headrace.engine.kv.kv_cache import KVCache
from headrace.models.args import ModelArgs

ARGS = ModelArgs(
    architecture="LlamaForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=64,
    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6,
    max_position_embeddings=128, hidden_act="silu", tie_word_embeddings=True,
)  # fmt: skip

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pools_read_as_zeros(dtype: torch.dtype, device: str) -> None:
    cache = KVCache(ARGS, num_blocks=1000, block_size=16, dtype=dtype, device=torch.device(device))
    for k, v in cache.layers:
        assert k.shape == (1000, 16, 2, 8) and k.dtype == dtype and k.is_contiguous()
        assert k.device.type == device
        assert not k.any() and not v.any()
    assert cache.nbytes == 2 * 2 * 1000 * 16 * 2 * 8 * dtype.itemsize


def test_pools_are_separate_memory() -> None:
    cache = KVCache(
        ARGS, num_blocks=8, block_size=4, dtype=torch.float32, device=torch.device("cpu")
    )
    (k0, v0), (k1, _) = cache.layers
    k0.fill_(1.0)
    assert not v0.any() and not k1.any()
