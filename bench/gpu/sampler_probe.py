"""The sampled draw's two ways on the device, timed in one run: top_p.py's (the 1,024 likeliest
by `topk`, wide rows found by a read on the host) and top_p_fixed.py's (fixed shapes, nothing
read back), each through the sampler's own `_draw_torch` at T 0.8, top_p 0.95, over Gemma 3's
vocabulary; rows from peaked to flat, so some sets pass 1,024 tokens as a base model's do.
`same_mass`: the two ways' sets hold the same mass to 1e-6 of the row's (ties at the edge may
differ by id)."""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

import torch

from headrace.engine.runner import sampler, top_p_fixed
from headrace.engine.runner.top_p import top_p_mask
from headrace.engine.runner.top_p_fixed import top_p_cut

VOCAB, TOP_P = 262_144, 0.95


def top_p_times(device: torch.device, quick: bool) -> dict[str, Any]:
    rows = [1, 4] if quick else [1, 16, 64, 256]
    vocab, repeats = (8_192, 2) if quick else (VOCAB, 10)
    out: dict[str, Any] = {"vocab": vocab, "top_p": TOP_P}
    for r in rows:
        x = _logits(r, vocab, device)
        ps, uniforms = [TOP_P] * r, [0.5] * r
        level: dict[str, Any] = {"same_mass": _same_mass(x, ps)}
        for way in ("topk", "fixed"):
            draw = partial(_draw, x, ps, uniforms, way == "fixed")
            level[f"{way}_ms"] = _median_ms(draw, device, repeats)
        out[f"rows{r}"] = level
    return out


def _draw(x: torch.Tensor, ps: list[float], uniforms: list[float], fixed: bool) -> torch.Tensor:
    takes = top_p_fixed.takes
    top_p_fixed.takes = lambda _x: fixed  # type: ignore[assignment]
    try:
        return sampler._draw_torch(x, ps, uniforms)
    finally:
        top_p_fixed.takes = takes  # type: ignore[method-assign]


def _logits(r: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[r, vocab] float32 at T 0.8: scales from flat (a set of thousands) to peaked."""
    g = torch.Generator().manual_seed(r)
    scales = torch.tensor([0.5, 1.0, 2.0, 4.0])[torch.arange(r) % 4]
    return (torch.randn(r, vocab, generator=g) * scales[:, None] / 0.8).to(device)


def _same_mass(x: torch.Tensor, ps: list[float]) -> bool:
    probs = torch.softmax(x.double(), dim=-1)
    a = top_p_mask(x, ps) > float("-inf")
    b = top_p_cut(x, torch.tensor(ps, dtype=torch.float64, device=x.device)) > float("-inf")
    diff = (probs * a).sum(-1) - (probs * b).sum(-1)
    return bool(diff.abs().max() < 1e-6)  # top_p.py's total is a float32 sum


def _median_ms(fn: Any, device: torch.device, repeats: int) -> float:
    fn()  # warm: kernels compiled, pools grown
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 3)
