"""The grammar-mask kernel bans exactly the tokens whose bit is clear, as the torch path does."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels.build import cpu_kernels
from headrace.kernels.token_mask import _torch_mask, mask_tokens

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="no C compiler: kernels off")


def _bitmask(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int64)
    mask = mask.to(torch.int32)
    mask[0, : words // 2] = -1  # all allowed (every bit, the sign bit too)
    mask[-1, words // 3 :] = 0  # none allowed
    return mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 262144])
def test_kernel_equals_the_torch_path(dtype: torch.dtype, vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(7, vocab, generator=g).to(dtype)
    rows = [6, 1, 3]
    bitmask = _bitmask(len(rows), vocab, vocab)
    expected = logits.clone()
    _torch_mask(expected, rows, bitmask)
    mask_tokens(logits, rows, bitmask)
    assert torch.equal(logits, expected)
    untouched = [r for r in range(7) if r not in rows]
    assert torch.isfinite(logits[untouched]).all()


def test_a_single_allowed_token_is_the_only_finite_logit() -> None:
    vocab = 262144
    logits = torch.randn(2, vocab).bfloat16()
    bitmask = torch.zeros(1, vocab // 32, dtype=torch.int32)
    bitmask[0, 106 // 32] = 1 << (106 % 32)
    mask_tokens(logits, [1], bitmask)
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [106]
    assert torch.isfinite(logits[0]).all()
