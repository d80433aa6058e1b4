"""Bounds of the full-precision logits from the int8 head, for exact sampling
(engine/runner/screened_sampler.py; the kernels are head_envelope_q8 and head_bounds_q8 in
int8_head.c, the bound is derived there).

Every token v of a row x gets lb_v <= x . w_v <= ub_v: the two-limb screen's proven bound,
with the hidden state's OUTLIERS heaviest channels summed in fp32 apart from the limbs. Most of
the bound is the weights' rounding, s_v / 2 per channel times |x|_1, and Gemma's heavy channels
hold a quarter of |x|_1 on random-token rows: taking the 8 heaviest apart nearly doubles the
proposals' acceptance there (OUTLIERS). The sampler needs them weighed, not listed: the scan
keeps per group of 16 tokens max ub, sum exp((ub - max ub) / T) and max lb ([M, V/16], not
[M, V]), and `group_bounds` computes a group's ub and lb again, bit for bit, for the
proposals drawn from it.

Shapes: x [M, H] -> GroupEnvelope of [M, G] (G = V16 / 16); pairs (row, group) [n] ->
[n, 16] ub, lb (-inf past the vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headrace.kernels.build import cpu_kernels
from headrace.kernels.int8_screen import HeadArrays, outlier_channels

# Heavy channels taken apart. bench/sampled_head.py --prompts random --outliers 0,8,16 (2-core
# EPYC without AMX, T 0.8, 11 steps): proposals a token 16.9 / 9.9 / 7.7 at 16 rows, 17.4 / 10.1
# / 8.2 at 32; rows left to the full head 23 / 4 / 0 and 40 / 6 / 4; the sampler 21.9 / 22.8 /
# 23.5 ms and 41.2 / 42.7 / 45.1 (the scan pays ~0.15 ms a channel at 16 rows).
OUTLIERS = 8


@dataclass(frozen=True)
class GroupEnvelope:
    gmax: torch.Tensor  # [M, G] max ub_v of the group (-inf: padding)
    gsum: torch.Tensor  # [M, G] sum exp((ub_v - gmax) / T) (0: padding)
    glow: torch.Tensor  # [M, G] max lb_v of the group

    def log_mass(self, inv_t: torch.Tensor) -> torch.Tensor:  # [M, G]
        """log sum_v exp(ub_v / T) per group: the proposal's weight of each group."""
        return self.gmax * inv_t[:, None] + self.gsum.log()


class Int8Envelope:
    def __init__(self, head: HeadArrays, outliers: int = OUTLIERS) -> None:
        """outliers: the heavy channels summed in fp32 apart from the limbs (0: none)."""
        self.head = head
        self.vocab = head.weight.shape[0]
        self.groups = head.v16 // 16
        self.num_outliers = outliers
        self._chosen: tuple[torch.Tensor, torch.Tensor] | None = None
        # The channels of the last envelope: group_bounds must take the same ones.
        self._taken = (torch.zeros(0, dtype=torch.int32), torch.zeros(0))

    def _outliers(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[K] int32 channels, [V16/16, K, 16] fp32 weights; chosen from the first rows seen
        (Gemma's heavy channels are the same from step to step and prompt to prompt; a poor
        choice costs acceptance, never exactness)."""
        if self._chosen is None:
            if self.num_outliers == 0:
                self._chosen = (torch.zeros(0, dtype=torch.int32), torch.zeros(0))
            else:
                self._chosen = outlier_channels(self.head, x, self.num_outliers)
        return self._chosen

    def padded(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, H'] any float dtype -> [M, H] fp32, zero columns up to the head's width."""
        x = hidden.float()
        width = self.head.weight.shape[1]
        if x.shape[-1] != width:
            x = torch.nn.functional.pad(x, (0, width - x.shape[-1]))
        return x.contiguous()

    def envelope(
        self, x: torch.Tensor, inv_t: torch.Tensor, every: bool = False
    ) -> tuple[GroupEnvelope, torch.Tensor | None, torch.Tensor | None]:
        """x [M, H] fp32 (`padded`), inv_t [M] -> the group envelope, and with `every` each
        token's ub and lb [M, V] (tests)."""
        m = x.shape[0]
        gmax = torch.full((m, self.groups), float("-inf"))
        gsum = torch.zeros(m, self.groups)
        glow = torch.full((m, self.groups), float("-inf"))
        ub = torch.empty(m, self.vocab) if every else None
        lb = torch.empty(m, self.vocab) if every else None
        inv = inv_t.float().contiguous()
        h = self.head
        chans, weights = self._taken = self._outliers(x)
        lib = cpu_kernels()
        assert lib is not None
        lib.head_envelope_q8(
            x.data_ptr(),
            m,
            x.shape[1],
            chans.data_ptr(),
            len(chans),
            weights.data_ptr(),
            h.packed.data_ptr(),
            h.scales.data_ptr(),
            h.qsum.data_ptr(),
            h.l1.data_ptr(),
            h.v16,
            self.vocab,
            inv.data_ptr(),
            gmax.data_ptr(),
            gsum.data_ptr(),
            glow.data_ptr(),
            0 if ub is None else ub.data_ptr(),
            0 if lb is None else lb.data_ptr(),
        )
        return GroupEnvelope(gmax, gsum, glow), ub, lb

    def group_bounds(
        self, x: torch.Tensor, rows: torch.Tensor, groups: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ub, lb [n, 16] of group groups[i] of row rows[i] (x as for the last `envelope`,
        whose outlier channels these take)."""
        n = len(rows)
        ub, lb = torch.empty(n, 16), torch.empty(n, 16)
        if n == 0:
            return ub, lb
        r = rows.to(torch.int64).contiguous()
        g = groups.to(torch.int64).contiguous()
        h = self.head
        chans, weights = self._taken
        lib = cpu_kernels()
        assert lib is not None
        lib.head_bounds_q8(
            x.data_ptr(),
            x.shape[0],
            x.shape[1],
            chans.data_ptr(),
            len(chans),
            weights.data_ptr(),
            h.packed.data_ptr(),
            h.scales.data_ptr(),
            h.qsum.data_ptr(),
            h.l1.data_ptr(),
            self.vocab,
            r.data_ptr(),
            g.data_ptr(),
            n,
            ub.data_ptr(),
            lb.data_ptr(),
        )
        return ub, lb
