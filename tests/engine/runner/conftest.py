"""The sampler's two ways of drawing, for the tests that run on both."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import sample_draw


@pytest.fixture(params=["c", "torch"])
def draw_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The sampler's draw: in C (kernels/sample_draw.c, the CPU's), or with torch (top_p.py's
    set, then the inverse CDF: CUDA's, and without a compiler)."""
    if request.param == "c" and not sample_draw.supported(torch.zeros(1, 1)):
        pytest.skip("no C compiler: the torch path draws")
    if request.param == "torch":
        monkeypatch.setattr(sample_draw, "supported", lambda x: False)
    return str(request.param)
