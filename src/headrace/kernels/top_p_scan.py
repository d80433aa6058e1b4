"""The sure and edge tokens of each row's top_p set, in two passes over the row (top_p.c):
what engine/runner/top_p.py sorts only the edge of.

Shapes: x [R, V] fp32 (contiguous, CPU), p [R] -> per row its largest logit, Z = sum
exp(x - max) (relative error ~2e-7), and two lists of ids, ascending: the tokens surely in the
set, and the edge whose order decides the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headrace.kernels.build import cpu_kernels


@dataclass(frozen=True)
class Scan:
    top: torch.Tensor  # [R] fp32
    total: torch.Tensor  # [R] float64, in units of exp(top)
    sure: list[torch.Tensor]  # R x [n] int64 ids
    edge: list[torch.Tensor]  # R x [m] int64 ids


def supported(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and cpu_kernels() is not None


def scan(x: torch.Tensor, p: list[float]) -> Scan:
    lib = cpu_kernels()
    assert lib is not None
    x = x.contiguous()
    r, v = x.shape
    ps = torch.tensor(p, dtype=torch.float64)
    top, total = torch.empty(r), torch.empty(r, dtype=torch.float64)
    first, last, n_sure, n_edge = (torch.empty(r, dtype=torch.int64) for _ in range(4))
    lib.top_p_scan(
        x.data_ptr(), r, v, ps.data_ptr(), top.data_ptr(), total.data_ptr(),
        first.data_ptr(), last.data_ptr(), n_sure.data_ptr(), n_edge.data_ptr(),
    )  # fmt: skip
    sure_at, edge_at = _offsets(n_sure), _offsets(n_edge)
    sure = torch.empty(int(n_sure.sum()), dtype=torch.int64)
    edge = torch.empty(int(n_edge.sum()), dtype=torch.int64)
    lib.top_p_collect(
        x.data_ptr(), r, v, top.data_ptr(), first.data_ptr(), last.data_ptr(),
        sure_at.data_ptr(), edge_at.data_ptr(), sure.data_ptr(), edge.data_ptr(),
    )  # fmt: skip
    return Scan(top, total, _rows(sure, sure_at, n_sure), _rows(edge, edge_at, n_edge))


def _rows(flat: torch.Tensor, at: torch.Tensor, n: torch.Tensor) -> list[torch.Tensor]:
    return [flat[a : a + k] for a, k in zip(at.tolist(), n.tolist(), strict=True)]


def _offsets(counts: torch.Tensor) -> torch.Tensor:
    return (counts.cumsum(0) - counts).contiguous()
