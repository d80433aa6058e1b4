"""The tied bf16 head in bf16_linear's layout (models/base.py): taken where the kernel runs, in
place of oneDNN's packed copy (not beside it), and its logits are the bf16 product's at any
row count: exact products, fp32 sums, one rounding to bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from factories import make_tiny

from headrace.kernels import bf16_linear
from headrace.loader.hf import load_model


def test_the_tied_head_reads_the_decode_kernels_layout(tmp_path: Path) -> None:
    make_tiny("gemma3", tmp_path, tie_word_embeddings=True, vocab_size=256)
    model, _ = load_model(tmp_path, torch.bfloat16, torch.device("cpu"), 64)
    if not bf16_linear.supported(model.embed_weight):
        pytest.skip("no AVX-512 BF16 or no C compiler: the head keeps oneDNN's packed copy")
    assert model.small_head is not None and model.packed_head is None
    embed = model.embed_weight.double()
    cap = model.args.final_logit_softcapping or 0.0
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 5, 33, 70):  # decode-sized, past bf16_linear's 64 rows as well
        x = (torch.randn(rows, embed.shape[1], generator=gen) * 3).bfloat16()
        exact = x.double() @ embed.t()
        got = model.compute_logits(x).double()
        # the fp32 sum and one bf16 rounding: half a bf16 step of the sum, plus fp32's slack
        fp32 = embed.shape[1] * 2.0**-23 * (x.double().abs() @ embed.abs().t())
        raw = torch.atanh((got / cap).clamp(-1 + 1e-7, 1 - 1e-7)) * cap if cap else got
        assert ((raw - exact).abs() <= 2.0**-8 * exact.abs() + fp32 + 1e-6).all(), rows
