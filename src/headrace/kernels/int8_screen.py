"""The one-limb screen of the exact int8 head, for CPUs with VNNI and no AMX (int8_screen.c).

Two u8 limbs per hidden row keep the int8 head's screening bound tight, but make as many VNNI
multiply-adds as the bf16 matmul makes bf16 ones. One limb halves them; its grid follows the
row's largest entry, and the few channels where Gemma's hidden states are tens of times larger
than elsewhere are taken out of it and added in fp32. The bound stays proven, so the pick stays
exact; what it costs is candidates: a few dozen a row on text, thousands on the flat next-token
distributions of random-token prompts (their first steps above all), whose rescoring can cost
more than the second limb saves. So the screen measures itself: it keeps a running mean of the
candidates a row keeps, and while that is above FLAT_CANDIDATES the head takes two limbs,
trying one limb again every PROBE_EVERY steps.

Shapes: x [M, H] fp32 -> [M] int64 token ids, -1 where a row kept more than CANDIDATE_LIMIT
(per thread) and must be screened again with two limbs.
"""

from __future__ import annotations

from typing import Protocol

import torch

from headrace.kernels.build import cpu_kernels

OUTLIERS = 16  # channels taken out of the limb (Gemma 3 270M: 393, 3, 507, 50, 76, 585, ...)
MIN_ROWS = 5  # below this, two limbs are as fast (the one-limb scan has fixed costs)
CANDIDATE_LIMIT = 32768  # per thread and row: past it the row is handed back (-1)
FLAT_CANDIDATES = 6000.0  # a row's mean candidates above which two limbs are faster here
PROBE_EVERY = 16


class OneLimbScreen:
    def __init__(self, head: HeadArrays) -> None:
        self.head = head
        self.reset()

    def reset(self) -> None:
        """Forget the outliers and the running mean, as a fresh server would have."""
        self.outliers: torch.Tensor | None = None  # [K] int32, chosen at the first call
        self.outlier_weights = torch.zeros(0)  # [V16/16, K, 16] fp32
        self.mean_candidates = 0.0  # running mean of candidates kept per row
        self.calls = 0

    def choose_outliers(self, x: torch.Tensor, k: int = OUTLIERS) -> None:
        """Take the k channels largest in `x` [M, H] (fp32) out of the limb.

        Gemma's hidden states keep their heavy channels from step to step and prompt to prompt,
        so the first step's rows choose them; a poor choice costs speed, never exactness.
        """
        self.outliers, self.outlier_weights = outlier_channels(self.head, x, k)

    def wanted(self, rows: int) -> bool:
        """Whether this step should take one limb (counts the call)."""
        if rows < MIN_ROWS:
            return False
        self.calls += 1
        return self.mean_candidates <= FLAT_CANDIDATES or self.calls % PROBE_EVERY == 0

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        head = self.head
        if self.outliers is None:
            self.choose_outliers(x)
        assert self.outliers is not None
        lib = cpu_kernels()
        assert lib is not None
        out = torch.empty(x.shape[0], dtype=torch.int64)
        kept = lib.head_argmax_q8_outliers(
            x.data_ptr(),
            x.shape[0],
            x.shape[1],
            self.outliers.data_ptr(),
            len(self.outliers),
            self.outlier_weights.data_ptr(),
            head.packed.data_ptr(),
            head.scales.data_ptr(),
            head.qsum.data_ptr(),
            head.l1.data_ptr(),
            head.v16,
            head.weight.data_ptr(),
            head.weight.shape[0],
            CANDIDATE_LIMIT,
            out.data_ptr(),
        )
        self.mean_candidates = 0.75 * self.mean_candidates + 0.25 * kept / x.shape[0]
        return out


def outlier_channels(
    head: HeadArrays, x: torch.Tensor, k: int = OUTLIERS
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k channels largest in `x` [M, H] (fp32), ascending [K] int32, and the head's weights
    in them, 16 vocabulary rows a vector: [V16/16, K, 16] fp32 (exact: the head is bf16)."""
    k = min(k, head.weight.shape[1])
    chosen = x.abs().amax(dim=0).topk(k).indices.sort().values
    cols = head.weight[:, chosen].float()  # [V, K]
    cols = torch.nn.functional.pad(cols, (0, 0, 0, head.v16 - head.weight.shape[0]))
    return chosen.to(torch.int32), cols.view(head.v16 // 16, 16, k).transpose(1, 2).contiguous()


class HeadArrays(Protocol):
    """What the screen reads of the int8 head (Int8GreedyHead has them)."""

    weight: torch.Tensor  # [V, H] bf16, H padded to whole quads
    v16: int
    packed: torch.Tensor
    scales: torch.Tensor
    qsum: torch.Tensor
    l1: torch.Tensor
