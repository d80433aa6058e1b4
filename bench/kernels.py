"""The CPU kernels against the torch paths they replace, on Gemma 3 270M's shapes. Prints JSON.

    .venv/bin/python bench/kernels.py
    .venv/bin/python bench/kernels.py --only causal,decode

* decode attention, one layer (Hq 4, Hkv 1, D 256, block 16, bf16): the in-place kernel vs the
  torch path (gather the blocks with index_select, then SDPA with a mask), at several batch
  sizes and context lengths; the ratio is torch time / kernel time;
* greedy argmax over [R, 262144] bf16 logits: the kernel vs `max(dim=-1)`;
* grammar masks (structured outputs) on [R, 262144] bf16 logits: the kernel vs torch unpacking;
* fused bf16 elementwise ops of a 512-token prefill (RMSNorm + residual, gelu x up, rotary of
  the 4 q + 1 k heads) and of a 32-row decode (rotary) vs torch;
* causal attention of a chunk that starts its sequence (Hq 4, Hkv 1, D 256, bf16, one layer):
  blocked matmuls (layers/causal_attention.py) vs SDPA with is_causal, at 128-2,048 tokens;
* int8 layer matmuls (kernels/int8_linear.py: per-row u8 activations x per-channel s8
  weights, the quantization and row scaling included) vs packed bf16 oneDNN, on Gemma 3's four
  layer shapes (qkv 640 -> 1,536, o 1,024 -> 640, gate_up 640 -> 4,096, down 2,048 -> 640)
  at 1-2,048 rows; the ratio is bf16 time / int8 time;
* decode-sized int8 (`int8-small`, 1-64 rows): int8_small.c against bf16_linear's kernel and
  oneDNN's int8 matmul, on the four layer shapes, 18 weights in turn: where each quantized
  projection (models/base.py INT8_PROJECTIONS) takes its int8 copy, and which int8 kernel;
* bf16 layer matmuls of decode-sized steps (kernels/bf16_linear.py) vs packed bf16 oneDNN, on
  the four layer shapes at 1-96 rows, each through 18 weights in turn (a step's layers: the
  weights come from memory, as in a real step, not from cache); ms per layer, the ratio is
  oneDNN time / kernel time;
* decode matmuls on a GGUF's quantized blocks (kernels/block_linear.py: 1-byte codes and two
  fp32 constants a block) vs the bf16 kernel above, on the four layer shapes with Gemma 3
  270M's Q4_K_M block types (qkv and gate_up Q5_0, o Q4_K, down Q6_K) at 1-8 rows, 18 weights
  in turn; ms per layer, the ratio is bf16 kernel time / blocks time;
* the bf16 head's logits (`head-bf16`, 1-512 rows): bf16_linear's kernel vs oneDNN's packed
  matmul over the 262144 x 640 head;
* the greedy head, [R, 640] hidden rows -> token ids over a 262144 x 640 bf16 head (random
  weights of Gemma's scale): the exact int8 head vs the bf16 oneDNN matmul + argmax kernel;
* a few-row step's sampled logits over the same head (`q8head`): the Q8_0 head
  (kernels/q8_head.py, fp32 logits) vs the bf16 oneDNN head and the int8 envelope (what the
  screened sampler reads before its rejection), at 1-4 rows.

Each figure is the best of several rounds, the two sides alternating.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward  # noqa: E402  (beside this script)

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.kernels import bf16_linear, block_linear, fused, q8_head
from headrace.kernels.argmax import argmax_rows
from headrace.kernels.int8_envelope import Int8Envelope
from headrace.kernels.int8_head import Int8GreedyHead
from headrace.kernels.int8_linear import Int8Linear
from headrace.kernels.token_mask import _torch_mask, mask_tokens
from headrace.layers.attention import _decode
from headrace.layers.causal_attention import causal_attention
from headrace.layers.linear import bucket_rows, pack_weight, packed_linear, padded_rows
from headrace.layers.rotary import RotaryEmbedding
from headrace.request import SamplingParams

HQ, HKV, D, BS, VOCAB = 4, 1, 256, 16, 262144
POOL_BLOCKS = 8192
CAUSAL_LENGTHS = (128, 256, 384, 512, 1024, 2048)
LAYER_SHAPES = {"qkv": (1536, 640), "o": (640, 1024), "gate_up": (4096, 640), "down": (640, 2048)}
INT8_ROWS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
BF16_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96)
BLOCK_TYPES = {"qkv": (32, 31), "o": (32, 15), "gate_up": (32, 31), "down": (16, 63)}
LAYERS = 18


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    return forward.best_time(fn, repeats) * 1e3


def decode_case(batch: int, context: int, repeats: int) -> dict[str, float]:
    blocks = -(-(context + 1) // BS)
    # a pool of 64 MiB per K and V (as a served model's, far past the caches); blocks scattered
    pool = max(batch * blocks + 1, POOL_BLOCKS)
    k_cache = torch.randn(pool, BS, HKV, D).bfloat16()
    v_cache = torch.randn_like(k_cache)
    perm = (torch.randperm(pool - 1)[: batch * blocks] + 1).view(batch, blocks).tolist()
    sched = [
        ScheduledRequest(str(i), [0], context, perm[i], True, SamplingParams(), 0)
        for i in range(batch)
    ]
    cpu = torch.device("cpu")
    views = {
        kernel: build_step_inputs(sched, BS, [None], cpu, torch.bfloat16, kernel).meta
        for kernel in (False, True)
    }
    q = torch.randn(batch, HQ, D).bfloat16()
    ms = {
        kernel: best_ms(
            lambda m=m: _decode(q, k_cache, v_cache, m.decode_views[None], D**-0.5), repeats
        )
        for kernel, m in views.items()
    }
    return {"torch_ms": ms[False], "kernel_ms": ms[True], "ratio": ms[False] / ms[True]}


def causal_case(n: int, repeats: int) -> dict[str, float]:
    q = torch.randn(n, HQ, D).bfloat16()
    k, v = torch.randn(n, HKV, D).bfloat16(), torch.randn(n, HKV, D).bfloat16()
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    scale = D**-0.5
    sdpa_ms = best_ms(
        lambda: F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True
        ),
        repeats,
    )
    blocked_ms = best_ms(lambda: causal_attention(q, k, v, scale), repeats)
    return {"sdpa_ms": sdpa_ms, "blocked_ms": blocked_ms, "ratio": sdpa_ms / blocked_ms}


def int8_small_cases(repeats: int) -> dict[str, dict[str, float]]:
    """Decode-sized steps: bf16_linear's kernel, int8_small.c's and oneDNN's int8 matmul, each
    through LAYERS weights in turn as a step's layers are (from memory, not cache); ms per layer,
    `ratio` = bf16 / int8_small, `onednn_ratio` = oneDNN int8 / int8_small."""
    out: dict[str, dict[str, float]] = {}
    for name, (n_out, n_in) in LAYER_SHAPES.items():
        weights = [(torch.randn(n_out, n_in) * 0.05).bfloat16() for _ in range(LAYERS)]
        int8s = [Int8Linear.build(w) for w in weights]
        if int8s[0] is None or int8s[0].small is None or not bf16_linear.supported(weights[0]):
            return {"unavailable": {}}
        smalls = [bf16_linear.pack(w) for w in weights]
        for r in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
            x = torch.randn(r, n_in).bfloat16()
            bf16_ms = best_ms(
                lambda x=x, ps=smalls: [bf16_linear.linear(x, p, None) for p in ps], repeats
            )
            int8_ms = best_ms(lambda x=x, qs=int8s: [q._small(x, None) for q in qs if q], repeats)
            onednn_ms = best_ms(lambda x=x, r=r, qs=int8s: [onednn(q, x, r) for q in qs], repeats)
            out[f"{name}_rows{r}"] = {
                "bf16_ms": bf16_ms / LAYERS,
                "int8_small_ms": int8_ms / LAYERS,
                "onednn_int8_ms": onednn_ms / LAYERS,
                "ratio": bf16_ms / int8_ms,
                "onednn_ratio": onednn_ms / int8_ms,
            }
    return out


def onednn(q: Int8Linear | None, x: torch.Tensor, rows: int) -> object:
    """oneDNN's int8 matmul on any row count (the layer hands it only steps past int8_small's)."""
    assert q is not None
    small, q.small = q.small, None
    try:
        return q(x, None, padded_rows(rows))
    finally:
        q.small = small


def int8_cases(repeats: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (n_out, n_in) in LAYER_SHAPES.items():
        weight = (torch.randn(n_out, n_in) * 0.05).bfloat16()
        packed, int8 = pack_weight(weight), Int8Linear.build(weight)
        if packed is None or int8 is None:
            return {"unavailable": {}}
        for r in INT8_ROWS:
            x = torch.randn(r, n_in).bfloat16()
            bf16_ms = best_ms(lambda x=x, p=packed: packed_linear(x, p, None), repeats)
            int8_ms = best_ms(lambda x=x, r=r, q=int8: q(x, None, bucket_rows(r)), repeats)
            out[f"{name}_rows{r}"] = {"bf16_ms": bf16_ms, "int8_ms": int8_ms,
                                      "ratio": bf16_ms / int8_ms}  # fmt: skip
    return out


def bf16_cases(repeats: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (n_out, n_in) in LAYER_SHAPES.items():
        weights = [(torch.randn(n_out, n_in) * 0.05).bfloat16() for _ in range(LAYERS)]
        if not bf16_linear.supported(weights[0]):
            return {"unavailable": {}}
        onednn = [pack_weight(w) for w in weights]
        small = [bf16_linear.pack(w) for w in weights]
        for r in BF16_ROWS:
            x = torch.randn(r, n_in).bfloat16()
            a = best_ms(lambda x=x, ws=onednn: [packed_linear(x, p, None) for p in ws], repeats)
            b = best_ms(lambda x=x, ws=small: [bf16_linear.linear(x, p, None) for p in ws], repeats)
            out[f"{name}_rows{r}"] = {"onednn_ms": a / LAYERS, "kernel_ms": b / LAYERS,
                                      "ratio": a / b}  # fmt: skip
    return out


def block_cases(repeats: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (n_out, n_in) in LAYER_SHAPES.items():
        block, top = BLOCK_TYPES[name]
        if not block_linear.supported(n_out, n_in, block):
            return {"unavailable": {}}
        parts = [
            (
                torch.randint(0, top + 1, (n_out, n_in), dtype=torch.uint8),
                scale := torch.rand(n_out, n_in // block) * 0.01,
                -scale * (top + 1) / 2,
            )
            for _ in range(LAYERS)
        ]
        small = [bf16_linear.pack(block_linear.dequantize(*p).bfloat16()) for p in parts]
        packed = [block_linear.pack(*p) for p in parts]
        for r in (1, 2, 3, 4, 6, 8):
            x = torch.randn(r, n_in).bfloat16()
            a = best_ms(lambda x=x, ws=small: [bf16_linear.linear(x, p, None) for p in ws], repeats)
            b = best_ms(
                lambda x=x, ws=packed: [block_linear.linear(x, p, None) for p in ws], repeats
            )
            out[f"{name}_rows{r}"] = {"bf16_ms": a / LAYERS, "blocks_ms": b / LAYERS,
                                      "ratio": a / b}  # fmt: skip
    return out


def argmax_case(rows: int, repeats: int) -> dict[str, float]:
    x = torch.randn(rows, VOCAB).bfloat16()
    torch_ms = best_ms(lambda: x.max(dim=-1).indices, repeats)
    kernel_ms = best_ms(lambda: argmax_rows(x), repeats)
    return {"torch_ms": torch_ms, "kernel_ms": kernel_ms, "ratio": torch_ms / kernel_ms}


def token_mask_case(rows: int, repeats: int) -> dict[str, float]:
    """Grammar masks on [rows, 262144] bf16 logits (random bits: the worst case)."""
    x = torch.randn(rows, VOCAB).bfloat16()
    bits = torch.randint(-(2**31), 2**31 - 1, (rows, VOCAB // 32), dtype=torch.int64)
    bitmask, index = bits.to(torch.int32), list(range(rows))
    kernel_ms = best_ms(lambda: mask_tokens(x, index, bitmask), repeats)
    torch_ms = best_ms(lambda: _torch_mask(x, index, bitmask), repeats)
    return {"kernel_ms": kernel_ms, "torch_ms": torch_ms, "speedup": torch_ms / kernel_ms}


def head_bf16_cases(repeats: int) -> dict[str, dict[str, float]]:
    """The bf16 head's logits (262144 x 640, what sampled rows past the screens and logprobs
    read): oneDNN's packed matmul vs bf16_linear's kernel, ms; the ratio is oneDNN / kernel."""
    weight = (torch.randn(VOCAB, 640) * 0.03).bfloat16()
    packed = pack_weight(weight)
    if packed is None or not bf16_linear.supported(weight):
        return {"unavailable": {}}
    small = bf16_linear.pack(weight)
    del weight
    out = {}
    for r in (1, 4, 8, 16, 32, 64, 128, 512):
        x = torch.randn(r, 640).bfloat16()
        a = best_ms(lambda x=x: packed_linear(x, packed, None), repeats)
        b = best_ms(lambda x=x: bf16_linear.linear(x, small, None), repeats)
        out[f"rows{r}"] = {"onednn_ms": a, "kernel_ms": b, "ratio": a / b}
    return out


def head_cases(rows: list[int], repeats: int) -> dict[str, dict[str, float]]:
    weight = (torch.randn(VOCAB, 640) * 0.03).bfloat16()
    packed = pack_weight(weight)
    int8 = Int8GreedyHead(weight)
    out = {}
    for r in rows:
        x = (torch.randn(r, 640) * 3).bfloat16()
        if packed is not None:
            bf16_ms = best_ms(lambda x=x: argmax_rows(packed_linear(x, packed, None)), repeats)
        else:
            bf16_ms = best_ms(lambda x=x: argmax_rows(x @ weight.t()), repeats)
        int8_ms = best_ms(lambda x=x: int8.argmax(x), repeats)
        out[f"rows{r}"] = {"bf16_ms": bf16_ms, "int8_ms": int8_ms, "ratio": bf16_ms / int8_ms}
    return out


def q8_head_cases(repeats: int) -> dict[str, dict[str, float]]:
    q = torch.randint(-127, 128, (VOCAB, 640), dtype=torch.int8)
    d = (torch.rand(VOCAB, 20) * 4e-4 + 1e-4).half()
    weight = (q.float() * d.float().repeat_interleave(32, dim=1)).bfloat16()
    packed, q8, env = pack_weight(weight), q8_head.pack(q, d), Int8Envelope(Int8GreedyHead(weight))
    out = {}
    for r in (1, 2, 3, 4):
        x = (torch.randn(r, 640) * 3).bfloat16()
        bf16_ms = best_ms(
            lambda x=x: packed_linear(x, packed, None) if packed is not None else x @ weight.t(),
            repeats,
        )
        q8_ms = best_ms(lambda x=x: q8_head.logits(x, q8), repeats)
        inv_t = torch.ones(r)
        env_ms = best_ms(lambda x=x, t=inv_t: env.envelope(env.padded(x), t), repeats)
        out[f"rows{r}"] = {"bf16_ms": bf16_ms, "q8_ms": q8_ms, "envelope_ms": env_ms,
                           "bf16_over_q8": bf16_ms / q8_ms}  # fmt: skip
    return out


def fused_cases(repeats: int) -> dict[str, dict[str, float]]:
    """A 512-token bf16 prefill's elementwise ops: the fused kernels vs the torch ops."""
    x = (torch.randn(512, 640) * 5).bfloat16()
    res = torch.randn(512, 640).bfloat16()
    scale = 1 + torch.randn(640) * 0.1
    gate_up = (torch.randn(512, 4096) * 2).bfloat16()
    rope = RotaryEmbedding(D, {"rope_type": "default", "rope_theta": 10000.0}, 4096, 4096)
    cases = {
        "rms_norm_residual_512x640": (
            lambda: res + F.rms_norm(x.float(), (640,), scale, 1e-6).to(torch.bfloat16),
            lambda: fused.rms_norm(x, scale, 1e-6, cast_first=False, residual=res),
        ),
        "gelu_tanh_mul_512x2048": (
            lambda: F.gelu(gate_up[:, :2048], approximate="tanh") * gate_up[:, 2048:],
            lambda: fused.act_mul(gate_up, "gelu_tanh"),
        ),
    }
    for rows in (512, 32):  # the q and k heads after their norm: [rows, 5, 256]
        qk = torch.randn(rows, HQ + HKV, D).bfloat16()
        cos, sin = rope.cos_sin(torch.arange(rows) + 300, torch.bfloat16)
        cases[f"rotary_{rows}x5x256"] = (
            lambda qk=qk, cos=cos, sin=sin: qk * cos + qk.roll(D // 2, dims=-1) * sin,
            lambda qk=qk, cos=cos, sin=sin: fused.rope(qk, cos, sin),
        )
    out = {}
    for name, (ref, kernel) in cases.items():
        torch_ms, kernel_ms = best_ms(ref, repeats), best_ms(kernel, repeats)
        out[name] = {"torch_ms": torch_ms, "kernel_ms": kernel_ms, "ratio": torch_ms / kernel_ms}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--only", default="", help="comma-separated: decode,causal,argmax,...")
    args = parser.parse_args()
    cases: dict[str, Callable[[], object]] = {
        "decode": lambda: {
            f"batch{b}_ctx{c}": decode_case(b, c, args.repeats)
            for b in (1, 8, 32)
            for c in (300, 1000)
        },
        "causal": lambda: {f"tokens{n}": causal_case(n, args.repeats) for n in CAUSAL_LENGTHS},
        "argmax": lambda: {f"rows{r}": argmax_case(r, args.repeats) for r in (1, 8, 32)},
        "mask": lambda: {f"rows{r}": token_mask_case(r, args.repeats) for r in (1, 16, 32)},
        "fused": lambda: fused_cases(args.repeats),
        "int8": lambda: int8_cases(args.repeats),
        "int8-small": lambda: int8_small_cases(args.repeats),
        "bf16": lambda: bf16_cases(max(5, args.repeats // 3)),
        "blocks": lambda: block_cases(max(5, args.repeats // 3)),
        "head-bf16": lambda: head_bf16_cases(3),
        "head": lambda: head_cases([1, 2, 4, 8, 16, 32, 64, 128], max(5, args.repeats // 3)),
        "q8head": lambda: q8_head_cases(max(5, args.repeats // 3)),
    }
    only = args.only.split(",") if args.only else list(cases)
    report: dict[str, object] = {"threads": torch.get_num_threads()}
    for name in only:
        report[name] = cases[name]()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
