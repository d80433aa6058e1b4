"""Whether a token is in a row's top_p set, decided from the int8 head's bounds of the whole
row and exact logits where the bounds do not decide (screened_top_p.py's slow path: a token
drawn from the row's tail, or an edge the likeliest tokens' exact mass does not settle).

A token of exact l / T = lam is in the set iff A, the mass of the tokens likelier than it, is
below (p - RULE) Z. With u >= l / T >= w per token: a token whose w is above lam counts in A,
one whose u is at or below it in B = Z - A, one straddling lam in either; the four masked sums
bound A and B. Undecided, the least certain tokens are rescored (`first`, then 8x as many,
then the whole row) until it is decided; with every logit exact it is the rule itself.

Shapes: one row, [V] float32 bounds over T; x [H] fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

MARGIN = 1e-5  # relative, on the bounded sums: float32 exp and rounding, well past 1e-7
RULE = 1e-6  # the reference's "reaches p": to 1e-6 of the mass

# (token ids or None for the whole row) -> their exact l / T
Rescorer = Callable[[torch.Tensor | None], torch.Tensor]


@dataclass
class RowBounds:
    """u >= l / T >= w per token, eu = exp(u - top), ew = exp(w - top); a rescored token has
    u = w = its exact l / T."""

    u: torch.Tensor  # [V] float32
    w: torch.Tensor  # [V]
    mass: torch.Tensor  # [2, V] eu, ew
    top: float
    known: torch.Tensor  # [V] bool: rescored
    total: tuple[float, float] = (0.0, 0.0)  # sums of eu and ew (float64)
    violations: int = 0  # exact logits seen outside their bounds (must stay 0)

    @classmethod
    def of(cls, u: torch.Tensor, w: torch.Tensor, top: float) -> RowBounds:
        known = torch.zeros_like(u, dtype=torch.bool)
        b = cls(u.clone(), w.clone(), torch.exp(torch.stack([u, w]) - top), top, known)
        b.sum_up()
        return b

    @property
    def eu(self) -> torch.Tensor:
        return self.mass[0]

    @property
    def ew(self) -> torch.Tensor:
        return self.mass[1]

    def sum_up(self) -> None:
        t = self.mass.sum(dim=1, dtype=torch.float64).tolist()
        self.total = (t[0], t[1])

    def set_exact(self, tokens: torch.Tensor, exact: torch.Tensor) -> None:
        """Tokens' exact l / T in place of their bounds."""
        self.violations += int(((exact > self.u[tokens]) | (exact < self.w[tokens])).sum())
        self.u[tokens] = exact
        self.w[tokens] = exact
        self.mass[:, tokens] = torch.exp(exact - self.top)
        self.known[tokens] = True
        self.sum_up()


def inside(b: RowBounds, lam: float, p: float, rescore: Rescorer, first: int) -> bool:
    """Whether a token of exact l / T = lam is in the row's top_p set (b gains exact logits)."""
    goal, k = p - RULE, first
    while True:
        above = torch.stack([b.u > lam, b.w > lam])  # [2, V] may be / surely likelier
        if bool(b.known.all()):  # every logit exact: the rule itself, in float64
            a = float(b.eu.double() @ above[0].double())
            return a < goal * float(b.eu.sum(dtype=torch.float64))
        # [[eu, ew] . [may, surely]]: the four masked sums in one float32 product
        (a_may, a_sure), (w_may, w_sure) = (b.mass @ above.T.float()).tolist()
        a_hi, a_lo = a_may * (1 + MARGIN), w_sure * (1 - MARGIN)
        b_hi = (b.total[0] - a_sure) * (1 + MARGIN)  # eu of the tokens not surely above
        b_lo = (b.total[1] - w_may) * (1 - MARGIN)  # ew of the tokens surely not above
        if a_hi < goal * (a_hi + b_lo):
            return True
        if a_lo >= goal * (a_lo + b_hi):
            return False
        if k < len(b.u) // 8:
            unsure = torch.where(above[0] & ~above[1], b.eu, b.eu - b.ew)
            tokens = unsure.masked_fill_(b.known, -1.0).topk(k).indices
            b.set_exact(tokens, rescore(tokens))
        else:
            b.set_exact(torch.arange(len(b.u)), rescore(None))
        k *= 8
