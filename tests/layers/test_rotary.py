"""Rope frequencies and scaling equal transformers' for each supported rope type."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headrace.layers.rotary import RotaryEmbedding, apply_rotary, inv_freq_and_scale

CASES: list[dict[str, Any]] = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "beta_fast": 16,
        "beta_slow": 2,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
        "original_max_position_embeddings": 64,
    },
]


@pytest.mark.parametrize("params", CASES, ids=lambda p: p["rope_type"])
def test_inv_freq_matches_transformers(params: dict[str, Any]) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=1024,
        rope_parameters=dict(params),
    )
    ours, our_scale = inv_freq_and_scale(params, 64, 1024)
    if params["rope_type"] == "default":
        theirs = 1.0 / (10000.0 ** (torch.arange(0, 64, 2).float() / 64))
        their_scale = 1.0
    else:
        theirs, their_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    torch.testing.assert_close(ours, theirs)
    assert our_scale == pytest.approx(their_scale)


def test_rotation_preserves_norm_and_relative_position() -> None:
    rope = RotaryEmbedding(16, {"rope_type": "default", "rope_theta": 10000.0}, 64, 64)
    q = torch.randn(1, 2, 16)
    k = torch.randn(1, 2, 16)

    def score(pq: int, pk: int) -> torch.Tensor:
        cq, sq = rope.cos_sin(torch.tensor([pq]), torch.float32)
        ck, sk = rope.cos_sin(torch.tensor([pk]), torch.float32)
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum(-1)

    torch.testing.assert_close(score(10, 7), score(33, 30))
    cos, sin = rope.cos_sin(torch.tensor([5]), torch.float32)
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(dim=-1), q.norm(dim=-1))
