"""Int8 matmuls for prefill-sized bf16 steps on CPUs with int8 dot products (VNNI, AMX).

On the AMD EPYC here (AVX-512 VNNI, no AMX) one VPDPBUSD does twice the multiply-adds of a bf16
VDPBF16PS, and oneDNN's u8 x s8 matmul runs Gemma 3's layer shapes 1.4-1.9x faster than its
bf16 one from 64 rows up (`bench/kernels.py --only int8`).

- Weights: symmetric int8 per output channel, s_w[o] = max_d |w[o][d]| / 127, packed once.
- Activations: per row at each call, s_x[t] = max_d |x[t][d]| / 127, as u8 with zero point 128
  (`quantize_rows_u8` in int8_linear.c, one pass). oneDNN sums (q_x - 128) q_w exactly in int32
  and scales by s_w; the row scale s_x multiplies after.

Lossy: bf16 -> int8 rounds each activation to 1/254 of its row's largest. Whether that is
good enough is the quality gate's call (docs/performance.md); the setting is `--int8-matmuls`.
"""

from __future__ import annotations

import functools
import logging

import torch

from headrace.kernels.build import cpu_kernels

log = logging.getLogger(__name__)
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# Steps of SMALL_MIN_ROWS..SMALL_MAX_ROWS rows take int8_small.c, larger ones oneDNN; where
# int8_small.c cannot run, int8 starts at ONEDNN_MIN_ROWS (oneDNN's int8 is slow below it).
SMALL_MIN_ROWS = 5
SMALL_MAX_ROWS = 48
ONEDNN_MIN_ROWS = 32


@functools.cache
def int8_dot_cpu() -> bool:
    """True where the CPU has an int8 dot-product instruction oneDNN uses."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return any(flag in flags for flag in INT8_FLAGS)


def quantize_rows(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] bf16 (unit stride) -> (u8 [rows, D], fp32 scales [rows]); rows >= T pads."""
    lib = cpu_kernels()
    assert lib is not None
    t, d = x.shape
    q = torch.empty(rows, d, dtype=torch.uint8)
    s = torch.empty(rows, dtype=torch.float32)
    lib.quantize_rows_u8(x.data_ptr(), t, d, x.stride(0), rows, q.data_ptr(), s.data_ptr())
    return q, s


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (int8 [out, in], fp32 scales [out]): w ~ q * s per output channel."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


class Int8Linear:
    """`x W^T (+ b)` for bf16 x [T, in] through an int8 copy of W [out, in]."""

    def __init__(self, weight: torch.Tensor) -> None:
        q, self.w_scale = quantize_weight(weight)
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        self.w_zp = torch.zeros(weight.shape[0], dtype=torch.int64)
        # int8_small.c's copy for decode-sized steps, where oneDNN's int8 matmul is slow (a
        # second int8 copy: 65 MB for Gemma 3 270M's qkv and gate_up)
        self.small: torch.Tensor | None = None
        self.qsum = torch.zeros(0, dtype=torch.int32)
        lib = cpu_kernels()
        n, k = q.shape
        if lib is not None and lib.linear_q8_supported() and n % 64 == 0 and k % 4 == 0:
            self.small = q.reshape(n // 16, 16, k // 4, 4).transpose(1, 2).contiguous()
            self.qsum = q.sum(dim=1, dtype=torch.int32)
        self.min_rows = SMALL_MIN_ROWS if self.small is not None else ONEDNN_MIN_ROWS

    @classmethod
    def build(cls, weight: torch.Tensor) -> Int8Linear | None:
        """An int8 copy, or None where this machine or torch build cannot run one."""
        weight = weight.detach()
        if (
            weight.device.type != "cpu"
            or weight.dtype != torch.bfloat16
            or weight.dim() != 2
            or weight.shape[1] % 4
            or not int8_dot_cpu()
            or cpu_kernels() is None
        ):
            return None
        try:
            lin = cls(weight)
            probe = torch.randn(8, weight.shape[1], generator=torch.Generator().manual_seed(0))
            got = lin(probe.to(torch.bfloat16), None, 8).float()
        except (RuntimeError, AttributeError) as e:  # an op missing from this torch build
            log.info("oneDNN int8 matmul unavailable: %s", e)
            return None
        want = probe @ weight.float().t()
        # int8 rounding of both operands: a few percent of a row's scale, never more
        if not torch.allclose(got, want, rtol=0.05, atol=0.05 * float(want.abs().max())):
            return None
        return lin

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
        """x [T, in] bf16 -> [T, out] bf16, computed on `rows` >= T (padding) rows."""
        t = x.shape[0]
        if x.stride(1) != 1:
            x = x.contiguous()
        if self.small is not None and t <= SMALL_MAX_ROWS:
            return self._small(x, bias)
        q, s = quantize_rows(x, rows)
        y: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
            q, 1.0, 128, self.packed, self.w_scale, self.w_zp, None, 1.0, 0,
            torch.bfloat16, "none", [], "",
        )  # fmt: skip
        y = y[:t] if rows != t else y  # leading rows of a contiguous [rows, out]: contiguous
        if bias is not None:
            bias = bias.to(torch.bfloat16).contiguous()
        lib = cpu_kernels()
        assert lib is not None
        lib.scale_rows_bf16(y.data_ptr(), t, y.shape[1], s.data_ptr(),
                            bias.data_ptr() if bias is not None else None)  # fmt: skip
        return y

    def _small(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        assert self.small is not None
        t, k = x.shape
        n = self.small.shape[0] * 16
        q, s = quantize_rows(x, t)
        if bias is not None:
            bias = bias.to(torch.bfloat16).contiguous()
        y = torch.empty(t, n, dtype=torch.bfloat16)
        lib = cpu_kernels()
        assert lib is not None
        lib.linear_q8(q.data_ptr(), s.data_ptr(), t, k, self.small.data_ptr(),
                      self.qsum.data_ptr(), self.w_scale.data_ptr(), n,
                      bias.data_ptr() if bias is not None else None, y.data_ptr())  # fmt: skip
        return y
