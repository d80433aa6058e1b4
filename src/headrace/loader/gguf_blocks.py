"""A GGUF tensor's quantized blocks as `scale * code + offset`, for decode steps that compute
with the file's own weights (kernels/block_linear.py).

Each supported type stores a row in blocks of 16 or 32 weights, each `scale * q + offset`
with small integer q: Q4_0 `d (q - 8)`, Q5_0 `d (q - 16)`, Q4_1 / Q5_1 `d q + m`, Q4_K / Q5_K
`d sc_j q - dmin m_j` (sub-blocks of 32), Q6_K `d sc_j (q - 32)` (sub-blocks of 16). The scales
and offsets come from each block's header; the codes from the dequantized values, and
`scale * code + offset` is checked to give back every value exactly (else None: the tensor
keeps only its dense form). Q8_0's signed 8-bit codes do not fit block_linear's 7 bits; a tied
head's Q8_0 embedding is read straight from its bytes instead (`q8_0_form`: code q + 128,
offset -128 d), for the head's kernel (kernels/q8_head.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K

Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes [N, K] u8, scale, offset [N, K/B]

# type -> (bytes per block, weights per block, sub-block size)
LAYOUT = {
    Q.Q4_0: (18, 32, 32),
    Q.Q5_0: (22, 32, 32),
    Q.Q4_1: (20, 32, 32),
    Q.Q5_1: (24, 32, 32),
    Q.Q4_K: (144, 256, 32),
    Q.Q5_K: (176, 256, 32),
    Q.Q6_K: (210, 256, 16),
}


def _f16(raw: np.ndarray, at: int) -> np.ndarray:  # [n, 1] fp16 at byte `at` of each block
    return np.ascontiguousarray(raw[:, at : at + 2]).view(np.float16).astype(np.float32)


def scale_offset(raw: np.ndarray, kind: Q) -> tuple[np.ndarray, np.ndarray]:
    """raw [n_blocks, bytes] -> scale, offset [n_blocks, sub-blocks per block] f32."""
    d = _f16(raw, 0)
    if kind in (Q.Q4_0, Q.Q5_0):
        return d, d * np.float32(-8 if kind == Q.Q4_0 else -16)
    if kind in (Q.Q4_1, Q.Q5_1):
        return d, _f16(raw, 2)
    if kind in (Q.Q4_K, Q.Q5_K):
        sc, m = Q4_K.get_scale_min(np.ascontiguousarray(raw[:, 4:16]))
        return d * sc.astype(np.float32), -(_f16(raw, 2) * m.astype(np.float32))
    assert kind == Q.Q6_K
    scale = _f16(raw, 208) * raw[:, 192:208].view(np.int8).astype(np.float32)
    return scale, scale * np.float32(-32)


def block_form(raw: np.ndarray, kind: Q, values: np.ndarray) -> Blocks | None:
    """raw [N, row bytes] u8 of a 2-D tensor and its dequantized values [N, K] f32 ->
    (codes, scale, offset), or None where the type has no such form."""
    if kind not in LAYOUT or raw.ndim != 2 or values.ndim != 2:
        return None
    size, per_block, sub = LAYOUT[kind]
    n, k = values.shape
    scale, offset = scale_offset(np.asarray(raw).reshape(-1, size), kind)
    scale, offset = scale.reshape(n, k // sub), offset.reshape(n, k // sub)
    wide_s, wide_o = np.repeat(scale, sub, axis=1), np.repeat(offset, sub, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(wide_s != 0, np.rint((values - wide_o) / wide_s), 0)
    if not np.isfinite(q).all() or q.min() < 0 or q.max() > 127:
        return None  # a header's NaN / inf, or codes past 7 bits
    codes = q.astype(np.uint8)
    if not np.array_equal(wide_s * codes.astype(np.float32) + wide_o, values):
        return None
    return codes, scale.astype(np.float32), offset.astype(np.float32)


def q8_0_form(raw: np.ndarray, shape: tuple[int, ...]) -> Blocks | None:
    """Q8_0 blocks (an fp16 d, 32 int8 q: 34 bytes) as codes q + 128, scale d, offset -128 d:
    `d * q` exactly, as the dequantized values are."""
    n, k = shape
    if k % 32 or raw.size != n * (k // 32) * 34:
        return None
    blocks = np.asarray(raw).reshape(-1, 34)
    scale = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(np.float32)
    if not np.isfinite(scale).all():
        return None
    codes = np.ascontiguousarray(blocks[:, 2:]) ^ np.uint8(0x80)  # int8 q's byte -> q + 128
    scale = scale.reshape(n, k // 32)
    return codes.reshape(n, k), scale, scale * np.float32(-128)
