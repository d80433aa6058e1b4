"""Blocked causal attention (bf16 CPU prefill) against SDPA in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headrace.layers.causal_attention import BLOCK, causal_attention, use_blocked


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    qh, kh, vh = (t.float().transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    o = F.scaled_dot_product_attention(
        qh, kh, vh, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return o.squeeze(0).transpose(0, 1)


@pytest.mark.parametrize("n", [1, 7, BLOCK, BLOCK + 1, 3 * BLOCK - 5])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 1), (4, 2), (2, 2)])
def test_matches_sdpa_in_fp32(n: int, hq: int, hkv: int) -> None:
    g = torch.Generator().manual_seed(n * 10 + hq + hkv)
    d = 64
    q, k, v = (torch.randn(n, h, d, generator=g).bfloat16() for h in (hq, hkv, hkv))
    out = causal_attention(q, k, v, d**-0.5)
    assert out.shape == (n, hq, d) and out.dtype == torch.bfloat16
    ref = reference(q, k, v, d**-0.5)
    # bf16 probabilities and output: a few bf16 ulps of values of order 1
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)


def test_first_row_sees_only_itself_and_future_keys_do_not_leak() -> None:
    n, d = BLOCK + 10, 32
    q = torch.randn(n, 4, d).bfloat16()
    k, v = torch.randn(n, 1, d).bfloat16(), torch.randn(n, 1, d).bfloat16()
    out = causal_attention(q, k, v, 1.0)
    assert torch.equal(out[0], v[0].expand(4, d))  # one visible key: its value exactly
    k2, v2 = k.clone(), v.clone()
    k2[-1], v2[-1] = 100.0, -100.0  # change only the last token
    out2 = causal_attention(q, k2, v2, 1.0)
    assert torch.equal(out[:-1], out2[:-1])


def test_taken_only_for_reduced_precision() -> None:
    assert use_blocked(torch.zeros(2, 1, dtype=torch.bfloat16))
    assert not use_blocked(torch.zeros(2, 1, dtype=torch.float32))
