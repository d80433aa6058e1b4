"""The greedy pick from an int8 copy of the head, exact (the C kernels in int8_head.c and
int8_screen.c).

The 262k x 640 head of Gemma 3 is memory-bound on the CPU: 335 MB of bf16 weights read per
step, a third of a batch-32 decode step. The int8 copy is half the bytes, and with AVX-512 VNNI
the int8 dot products (u8 activations x s8 weights, exact int32 sums) keep up with memory up to
dozens of rows. The int8 logits only screen: every token whose int8 logit, within its proven
error bound, could be the maximum is rescored in fp32 from the bf16 weights, so the token
picked is the argmax of the full-precision logits (a few dozen rescored rows of 262k in
practice).

The int8 sums run on AMX tiles where the CPU has them (4 rows and more), else on AVX-512 VNNI,
where from 5 rows one u8 limb with the outlier channels in fp32 (int8_screen.py) replaces the
two limbs while the rows are not flat. Picks every plain greedy row (no logprobs, grammar or
processors) of every step (engine/runner/head_picks.py), in blocks of `max_rows`, where it beats the
full head: 256 with AMX (2.2x faster than the bf16 matmul at 32 rows, 2.2x at 128), 128 with
VNNI alone (on Gemma's hidden states, against the bf16 matmul: 12.9 vs 18.6 ms at 16 rows on
text, 16.7 vs 19.0 on random-token prompts, 28.6 vs 34.5 at 32 rows, 73 vs 130 at 128;
bench/greedy_head.py); never without VNNI, where the portable dot products lose to the bf16
matmul (bench/kernels.py, greedy_head). Costs 1 byte per head weight of memory (168 MB for
Gemma 3 270M), 16 MB more without AMX (the one-limb screen's outlier weights) and 8 MB more
once a step is sampled (the envelope's, int8_envelope.py).

Shapes: hidden [M, H] -> [M] int64 token ids.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels, switched_on
from headrace.kernels.int8_screen import OneLimbScreen

AMX_MAX_ROWS = 256
VNNI_MAX_ROWS = 128
_CHUNK = 16384  # rows quantized at a time: a bounded fp32 temporary


def supported(weight: torch.Tensor) -> bool:
    """bf16 on the CPU with the kernels built and VNNI, unless `HEADRACE_INT8_HEAD=0`."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and switched_on("HEADRACE_INT8_HEAD")
        and max_rows(weight.shape[-1]) > 0
    )


def max_rows(hidden: int) -> int:
    """The most rows a step may have for the int8 head to beat the bf16 matmul here."""
    lib = cpu_kernels()
    if lib is None or not lib.head_q8_vnni():
        return 0
    return AMX_MAX_ROWS if hidden % 64 == 0 and lib.head_q8_amx() else VNNI_MAX_ROWS


class Int8GreedyHead:
    def __init__(self, weight: torch.Tensor) -> None:  # [V, H] bf16
        self.weight = weight.contiguous()
        v, h = weight.shape
        self.vocab, self.hidden = v, -(-h // 4) * 4
        if self.hidden != h:  # zero columns: the same dot products, whole quads of 4
            self.weight = torch.nn.functional.pad(self.weight, (0, self.hidden - h))
        self.v16 = -(-v // 64) * 64  # whole blocks of 4 groups of 16 rows
        self.scales = torch.zeros(self.v16)
        self.l1 = torch.zeros(self.v16)
        quant = torch.zeros(self.v16, self.hidden, dtype=torch.int8)
        for start in range(0, v, _CHUNK):
            rows = self.weight[start : start + _CHUNK].float()
            scale = rows.abs().amax(dim=1) / 127
            self.scales[start : start + len(rows)] = scale
            self.l1[start : start + len(rows)] = rows.abs().sum(dim=1)
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
            quant[start : start + len(rows)] = (rows / safe).round_().clamp_(-127, 127)
        self.qsum = quant.sum(dim=1, dtype=torch.int32)
        self.max_rows = max_rows(self.hidden)
        # [V16/16, H/4, 16, 4]: 16 vocabulary rows by 4 hidden values, one VPDPBUSD operand
        self.packed = quant.view(-1, 16, self.hidden // 4, 4).transpose(1, 2).contiguous()
        lib = cpu_kernels()
        amx = lib is not None and self.hidden % 64 == 0 and lib.head_q8_amx()
        self.one_limb = None if amx else OneLimbScreen(self)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        assert hidden.shape[-1] <= self.hidden
        x = hidden.float()
        if x.shape[-1] != self.hidden:
            x = torch.nn.functional.pad(x, (0, self.hidden - x.shape[-1]))
        x = x.contiguous()
        if self.one_limb is None or not self.one_limb.wanted(len(x)):
            return self._two_limbs(x)
        out = self.one_limb.argmax(x)
        flat = (out < 0).nonzero().flatten()
        if len(flat):  # rows whose candidates overflowed: two limbs keep far fewer
            out[flat] = self._two_limbs(x[flat].contiguous())
        return out

    def _two_limbs(self, x: torch.Tensor) -> torch.Tensor:
        lib = cpu_kernels()
        assert lib is not None
        out = torch.empty(x.shape[0], dtype=torch.int64)
        lib.head_argmax_q8(
            x.data_ptr(),
            x.shape[0],
            self.hidden,
            self.packed.data_ptr(),
            self.scales.data_ptr(),
            self.qsum.data_ptr(),
            self.l1.data_ptr(),
            self.v16,
            self.weight.data_ptr(),
            self.vocab,
            out.data_ptr(),
        )
        return out
