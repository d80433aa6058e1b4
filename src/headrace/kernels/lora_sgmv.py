"""Every adapter's LoRA term of one projection in one call (lora_sgmv.c), bf16 on the CPU.

torch's path costs two matmuls and an add per adapter per projection (8,064 calls a step for
32 adapters on Gemma 3 270M), or a gather that copies each row's adapter weights; this reads
each adapter's A and B where they lie, once a step, t = x A kept in fp32, one rounding of
y + t B to bf16.

Shapes: x [T, K] bf16, y [T, N] bf16 (updated in place); per adapter A packed [K/2, Rp, 2]
(`pack_a`), B [R, N] by blocks of 64 outputs, each block only the ranks that reach it
(`pack_b`: a merged projection's B is block-diagonal, and its zero blocks are neither kept nor
read); the step's adapter rows as
`rows` [P] int64 with `off` [G + 1] int64 marking each adapter's run.
"""

from __future__ import annotations

import torch

from headrace.kernels.build import cpu_kernels


def supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the kernel serves this adapter pair: A [K, R], B [R, N] bf16 on the CPU."""
    lib = cpu_kernels()
    return (
        a.device.type == "cpu"
        and a.dtype == b.dtype == torch.bfloat16
        and a.shape[0] % 2 == 0
        and b.shape[1] % 16 == 0
        and lib is not None
        and bool(lib.lora_sgmv_supported())
    )


def serves(weight: torch.Tensor) -> bool:
    """Whether the adapters of a model with this weight take the kernel (bf16 on the CPU)."""
    return supported(weight.new_zeros(2, 1), weight.new_zeros(1, 16))


def pack_a(a: torch.Tensor) -> torch.Tensor:
    """A [K, R] -> [K/2, Rp, 2] with Rp = R rounded up to 16 (zeros past R): one VDPBF16PS
    operand per 16 ranks and pair of inputs."""
    k, r = a.shape
    rp = (r + 15) // 16 * 16
    padded = a.new_zeros(k, rp)
    padded[:, :r] = a
    return padded.reshape(k // 2, 2, rp).transpose(1, 2).contiguous()


def pack_b(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B [R, N] -> its blocks of 64 outputs, each the rows lo..hi from the first to the last
    row not all zero there, 64 values a row (zeros past N), one after another; and the spans
    [ceil(N/64), 3] int64: lo, hi, where the block starts (lo = hi: nothing to read)."""
    r, n = b.shape
    blocks = (n + 63) // 64
    padded = b.new_zeros(r, blocks * 64)
    padded[:, :n] = b
    # a row is live in a block where its largest |value| is not 0 (torch's `any` over the
    # block costs 3x this)
    live = padded.view(r, blocks, 64).float().abs().amax(dim=2).t() != 0  # [blocks, R], NaN live
    by_block = padded.view(r, blocks, 64).transpose(0, 1)  # [blocks, R, 64]
    ranks = torch.arange(r).expand(blocks, r)
    lo = torch.where(live, ranks, r).amin(dim=1)
    hi = torch.where(live, ranks + 1, 0).amax(dim=1)
    lo = torch.where(hi > 0, lo, 0)  # a block with no live row: lo = hi = 0
    keep = (ranks >= lo[:, None]) & (ranks < hi[:, None])
    sizes = (hi - lo) * 64
    starts = torch.cumsum(sizes, dim=0) - sizes
    packed = by_block[keep].flatten() if bool(keep.any()) else b.new_zeros(1)
    return packed.contiguous(), torch.stack([lo, hi, starts], dim=1).to(torch.int64)


def usable(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether this step's activations suit the kernel (2-D bf16 rows, unit inner stride)."""
    return (
        x.dim() == 2
        and y.dim() == 2
        and x.dtype == y.dtype == torch.bfloat16
        and x.stride(1) == 1
        and y.stride(1) == 1
    )


def add(
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    off: torch.Tensor,
    pointers: torch.Tensor,
) -> torch.Tensor:
    """y[rows of g] += (x[rows of g] A_g) B_g for every group g; `pointers` [4, G] int64 holds
    each group's packed A address (0: the adapter skips this projection), packed B address,
    rank and B's spans' address."""
    lib = cpu_kernels()
    assert lib is not None
    groups = pointers.shape[1]
    status = lib.lora_sgmv_bf16(
        x.data_ptr(),
        x.stride(0),
        x.shape[1],
        y.data_ptr(),
        y.stride(0),
        y.shape[1],
        groups,
        rows.data_ptr(),
        off.data_ptr(),
        pointers[0].data_ptr(),
        pointers[1].data_ptr(),
        pointers[2].data_ptr(),
        pointers[3].data_ptr(),
    )
    if status != 0:
        raise MemoryError("lora_sgmv: no memory for the step's adapter activations")
    return y
