"""The sampler's two ways of drawing, for the tests that run on both."""

from __future__ import annotations

import pytest
import torch

from headrace.engine.runner import top_p_fixed
from headrace.kernels import sample_draw


@pytest.fixture(params=["c", "torch", "fixed"])
def draw_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The sampler's draw: in C (kernels/sample_draw.c, the CPU's), with torch (top_p.py's
    set, then the inverse CDF: without a compiler), or in fixed shapes (top_p_fixed.py's cut,
    then the inverse CDF over the whole row: CUDA's)."""
    if request.param == "c" and not sample_draw.supported(torch.zeros(1, 1)):
        pytest.skip("no C compiler: the torch path draws")
    if request.param in ("torch", "fixed"):
        monkeypatch.setattr(sample_draw, "supported", lambda x: False)
    monkeypatch.setattr(top_p_fixed, "takes", lambda x: request.param == "fixed")
    return str(request.param)
