"""The greedy pick from an int8 copy of the head, exact (the C kernel in cpu_kernels.c).

At a few rows the 262k x 640 head is memory-bound: 335 MB of bf16 weights read per step, about
14 ms of a 31 ms batch-1 Gemma 3 decode step here. The int8 copy is half the bytes. Its logits
only screen: every token whose int8 logit, within its proven error bound, could be the
maximum is rescored in fp32 from the bf16 weights, so the token picked is the argmax of the
full-precision logits (a few hundred rescored rows of 262k in practice).

Used for steps where every sampled request is greedy without logprobs and there are at most
`MAX_ROWS` of them (above that the bf16 matmul's FLOP rate wins; bench/kernels.py measures
both). Costs 1 byte per head weight of memory (168 MB for Gemma 3 270M).

Shapes: hidden [M, H] -> [M] int64 token ids.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels, switched_on

MAX_ROWS = 6  # measured break-even near 8 rows (bench/kernels.py)
_CHUNK = 16384  # rows quantized at a time: a bounded fp32 temporary


def supported(weight: torch.Tensor) -> bool:
    """bf16 on the CPU with the kernels built, unless `HEADRACE_INT8_HEAD=0`."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and switched_on("HEADRACE_INT8_HEAD")
        and cpu_kernels() is not None
    )


class Int8GreedyHead:
    def __init__(self, weight: torch.Tensor) -> None:  # [V, H] bf16
        self.weight = weight.contiguous()
        v, h = weight.shape
        self.vocab, self.hidden = v, h
        self.v16 = -(-v // 64) * 64  # whole blocks of 4 groups of 16 rows
        self.scales = torch.zeros(self.v16)
        quant = torch.zeros(self.v16, h, dtype=torch.int8)
        for start in range(0, v, _CHUNK):
            rows = self.weight[start : start + _CHUNK].float()
            scale = rows.abs().amax(dim=1) / 127
            self.scales[start : start + len(rows)] = scale
            safe = torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
            quant[start : start + len(rows)] = (rows / safe).round_().clamp_(-127, 127)
        # [V16 / 16, H, 16]: 16 vocabulary rows interleaved per hidden index
        self.packed = quant.view(-1, 16, h).transpose(1, 2).contiguous()

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        lib = cpu_kernels()
        assert lib is not None and hidden.shape[-1] == self.hidden
        x = hidden.float().contiguous()
        m = x.shape[0]
        approx = torch.empty(m, self.v16)
        out = torch.empty(m, dtype=torch.int64)
        lib.head_argmax_q8(
            x.data_ptr(),
            m,
            self.hidden,
            self.packed.data_ptr(),
            self.scales.data_ptr(),
            self.v16,
            self.weight.data_ptr(),
            self.vocab,
            approx.data_ptr(),
            out.data_ptr(),
        )
        return out
