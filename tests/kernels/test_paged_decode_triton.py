"""CUDA's in-place decode attention (a Triton kernel) against float64 attention over the
gathered blocks: on the GPU where there is one, else through Triton's interpreter on the CPU,
which runs the same kernel program element by element."""

from __future__ import annotations

import pytest
import torch

from kernels.on_triton import DEVICE

pytest.importorskip("triton")

from headrace.kernels import paged_decode  # noqa: E402
from headrace.kernels import paged_decode_triton as paged_decode_triton_module  # noqa: E402
from headrace.kernels.paged_decode import reference  # noqa: E402
from headrace.kernels.paged_decode_triton import paged_decode_triton  # noqa: E402
from kernels.test_paged_decode import SHAPE_IDS, SHAPES, make_case  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def run(case: tuple[torch.Tensor, ...], scale: float, splits: int = 1) -> torch.Tensor:
    q, kc, vc, table, bounds = (t.to(DEVICE) for t in case)
    return paged_decode_triton(q, kc, vc, table, bounds, scale, splits).cpu()


@pytest.mark.parametrize(("hq", "hkv", "d"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
@pytest.mark.parametrize("splits", [1, 3], ids=["whole", "3-spans"])
def test_kernel_matches_gathered_attention(
    hq: int, hkv: int, d: int, dtype: torch.dtype, splits: int
) -> None:
    # 3 spans: sequences of 1 and 5 positions leave spans empty, 300 cuts mid-block
    case, want = make_case(hq, hkv, d, dtype)
    got = run(case, d**-0.5, splits)
    assert got.dtype == dtype and got.shape == case[0].shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("bs", [1, 5, 32, 64], ids=lambda b: f"bs{b}")
def test_any_block_size(bs: int) -> None:
    """Each position finds its slot through the table, so a block need not be a loop turn."""
    case, want = make_case(4, 1, 64, torch.float32, bs)
    torch.testing.assert_close(run(case, 0.125).double(), want, atol=1e-5, rtol=1e-5)


def test_unwritten_slots_are_never_read() -> None:
    """Slots outside [lo, hi), blocks of no sequence and the blocks padded table entries name
    may hold anything, NaN included (on CUDA the pool is allocated uninitialized): the output
    must not see them."""
    (q, kc, vc, table, bounds), want = make_case(8, 2, 64, torch.float32)
    kc = torch.cat([kc, torch.full_like(kc[:1], float("nan"))])  # one more block, all NaN
    vc = torch.cat([vc, torch.full_like(vc[:1], float("nan"))])
    nan_block = kc.shape[0] - 1
    flat_k, flat_v = kc.view(-1, *kc.shape[2:]), vc.view(-1, *vc.shape[2:])
    for b in range(table.shape[0]):
        base, lo, hi = (int(x) for x in bounds[:, b])
        blocks = -(-(hi - base) // 16)
        table[b, blocks:] = nan_block  # padding names the NaN block
        tail = range(lo - base) if lo > base else range(0)
        tail = [*tail, *range(hi - base, blocks * 16)]  # before lo, and after hi in its block
        for rel in tail:
            slot = int(table[b, rel // 16]) * 16 + rel % 16
            flat_k[slot] = flat_v[slot] = float("nan")
    used = {int(x) for x in table.flatten()}
    spare = [i for i in range(kc.shape[0]) if i not in used]
    kc[spare] = vc[spare] = float("nan")
    got = run((q, kc, vc, table, bounds), 0.125)
    assert not got.isnan().any()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_reference_is_the_float64_attention() -> None:
    """`reference` is the oracle of the kernel's start-up probe on CUDA."""
    (q, kc, vc, table, bounds), want = make_case(8, 2, 64, torch.float64)
    got = reference(q, kc, vc, table, bounds, 0.125)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "shape", [paged_decode.PROBE_SHAPE, (4, 1, 256, 16), (4, 2, 24, 1)], ids=str
)
def test_the_start_up_probe_takes_a_right_kernel_and_refuses_a_wrong_one(
    dtype: torch.dtype, shape: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What decides, on a GPU, between the kernel and the gathered path, for the served
    model's heads and block size."""
    assert paged_decode._probe(DEVICE, dtype, shape)
    wrong = paged_decode_triton_module.paged_decode_triton

    def off_by_a_little(*args: object) -> torch.Tensor:
        return wrong(*args) * 1.1  # type: ignore[arg-type]

    monkeypatch.setattr(paged_decode_triton_module, "paged_decode_triton", off_by_a_little)
    assert not paged_decode._probe(DEVICE, dtype, shape)
