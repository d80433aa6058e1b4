"""The one-call LoRA kernel against a float64 product: every adapter's rows get (x A) B added
with one rounding to bf16, other rows stay as they were, and a row's result does not depend on
which rows share its step."""

from __future__ import annotations

import pytest
import torch

from headrace.kernels import lora_sgmv
from headrace.layers.lora import LoraBatch, LoraDelta

BF16 = torch.bfloat16
pytestmark = pytest.mark.skipif(
    not lora_sgmv.supported(torch.zeros(2, 1, dtype=BF16), torch.zeros(1, 16, dtype=BF16)),
    reason="no C compiler or no AVX-512 BF16",
)


def adapters(
    k: int, n: int, ranks: list[int], seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            (torch.randn(k, r, generator=g) / k**0.5).to(BF16),
            (torch.randn(r, n, generator=g) / r).to(BF16),
        )
        for r in ranks
    ]


def table(
    groups: list[tuple[list[int], tuple[torch.Tensor, torch.Tensor] | None]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """rows, off, pointers for lora_sgmv.add (None: the adapter skips the projection), and
    the packed A's, which must outlive the call."""
    rows = torch.tensor([r for members, _ in groups for r in members], dtype=torch.int64)
    off = torch.tensor([0] + [len(m) for m, _ in groups], dtype=torch.int64).cumsum(0)
    pointers = torch.zeros(4, len(groups), dtype=torch.int64)
    keep = []
    for g, (_, pair) in enumerate(groups):
        if pair is not None:
            a, b = pair
            keep += [lora_sgmv.pack_a(a), *lora_sgmv.pack_b(b)]
            pointers[:, g] = torch.tensor(
                [keep[-3].data_ptr(), keep[-2].data_ptr(), b.shape[0], keep[-1].data_ptr()]
            )
    return rows, off, pointers, keep


def exact(x: torch.Tensor, y: torch.Tensor, groups: list) -> torch.Tensor:
    want = y.double().clone()
    for members, pair in groups:
        if pair is not None:
            idx = torch.tensor(members, dtype=torch.int64)
            want[idx] += (x[idx].double() @ pair[0].double()) @ pair[1].double()
    return want


@pytest.mark.parametrize(("k", "n"), [(640, 1536), (96, 80), (2048, 640)])
def test_each_group_gets_its_term_rounded_once(k: int, n: int) -> None:
    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(23, k, generator=g).to(BF16)
    y = torch.randn(23, n, generator=g).to(BF16)
    pairs = adapters(k, n, [16, 48, 5, 80], seed=n)
    # contiguous and scattered rows, one adapter skipping the projection, rows 20-22 base
    groups = [
        (list(range(0, 6)), pairs[0]),
        ([9, 6, 14], pairs[1]),
        ([7, 8], None),
        ([10, 11, 12, 13, 15, 16, 17], pairs[2]),
        ([18, 19], pairs[3]),
    ]
    rows, off, pointers, _keep = table(groups)
    out = lora_sgmv.add(x, y.clone(), rows, off, pointers)
    want = exact(x, y, groups)
    # one rounding to bf16 (half an ulp: 2^-9 relative) plus fp32 sums, far below it
    assert ((out.double() - want).abs() <= want.abs() * 2.0**-8 + 1e-6).all()
    assert torch.equal(out[[7, 8, 20, 21, 22]], y[[7, 8, 20, 21, 22]])
    # nearer the exact sum than torch's bf16 path, which rounds t, the term and the sum
    torch_path = y.clone()
    for members, pair in groups:
        if pair is not None:
            idx = torch.tensor(members)
            torch_path[idx] += (x[idx] @ pair[0]) @ pair[1]
    assert (out.double() - want).abs().mean() < (torch_path.double() - want).abs().mean()


def test_a_row_gives_the_same_bits_alone_and_in_any_step() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 640, generator=g).to(BF16)
    y = torch.randn(12, 1024, generator=g).to(BF16)
    (pair,) = adapters(640, 1024, [16], seed=1)
    rows, off, pointers, _keep = table([(list(range(12)), pair)])
    together = lora_sgmv.add(x, y.clone(), rows, off, pointers)
    for row in (0, 5, 11):
        rows, off, pointers, _keep = table([([row], pair)])
        alone = lora_sgmv.add(x, y.clone(), rows, off, pointers)
        assert torch.equal(alone[row], together[row])


def test_rows_at_a_stride() -> None:
    g = torch.Generator().manual_seed(4)
    wide_x = torch.randn(8, 700, generator=g).to(BF16)
    wide_y = torch.randn(8, 300, generator=g).to(BF16)
    x, y = wide_x[:, :640], wide_y[:, :256]  # row strides 700 and 300
    (pair,) = adapters(640, 256, [16], seed=2)
    groups = [(list(range(8)), pair)]
    want, before = exact(x, y, groups), wide_y.clone()
    rows, off, pointers, _keep = table(groups)
    out = lora_sgmv.add(x, y, rows, off, pointers)
    assert out.data_ptr() == wide_y.data_ptr()
    assert ((out.double() - want).abs() <= want.abs() * 2.0**-8 + 1e-6).all()
    assert torch.equal(wide_y[:, 256:], before[:, 256:])  # past the view: untouched


def test_the_projection_takes_the_kernel_and_drops_an_adapter() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 640, generator=g).to(BF16)
    y = torch.randn(6, 1536, generator=g).to(BF16)
    pairs = adapters(640, 1536, [16, 8], seed=3)
    batch = LoraBatch()
    delta = LoraDelta(batch)
    for adapter_id, (a, b) in enumerate(pairs, start=1):
        delta.put(adapter_id, a, b)
    batch.segments = ((1, 2), torch.tensor([0, 1, 2, 4, 5]), torch.tensor([0, 3, 5]), 6)
    groups = [([0, 1, 2], pairs[0]), ([4, 5], pairs[1])]
    out = delta.add(x, y.clone())
    rows, off, pointers, _keep = table(groups)
    assert torch.equal(out, lora_sgmv.add(x, y.clone(), rows, off, pointers))
    delta.drop(2)  # evicted: its rows get nothing from this projection any more
    out = delta.add(x, y.clone())
    assert torch.equal(out[[3, 4, 5]], y[[3, 4, 5]])
    assert not torch.equal(out[:3], y[:3])
    with pytest.raises(ValueError, match="LoRA rows up to 5 in a step of 4 rows"):
        delta.add(x[:4], y[:4].clone())  # never read or written past the step's rows


@pytest.mark.parametrize("widths", [[1024, 256, 256], [48, 80, 32]])
def test_a_merged_projections_zero_blocks_are_skipped_exactly(widths: list[int]) -> None:
    """q, k and v stacked: each part's ranks reach only its outputs (B block-diagonal). Blocks
    of 64 outputs read only the ranks that reach them, also where a block spans two parts."""
    g = torch.Generator().manual_seed(6)
    n, ranks = sum(widths), [16, 8, 4]
    b = torch.zeros(sum(ranks), n)
    r0 = c0 = 0
    for r, w in zip(ranks, widths, strict=True):
        b[r0 : r0 + r, c0 : c0 + w] = torch.randn(r, w, generator=g) / r
        r0, c0 = r0 + r, c0 + w
    b = b.to(BF16)
    a = (torch.randn(640, sum(ranks), generator=g) / 640**0.5).to(BF16)
    packed, spans = lora_sgmv.pack_b(b)
    if widths[0] == 1024:  # aligned: q's 16 blocks keep ranks 0-16, k's 4 ranks 16-24, ...
        assert spans[:16, :2].tolist() == [[0, 16]] * 16
        assert spans[16:20, :2].tolist() == [[16, 24]] * 4
        assert spans[20:, :2].tolist() == [[24, 28]] * 4
        assert packed.numel() == 64 * (16 * 16 + 4 * 8 + 4 * 4)  # no zero block kept
    x = torch.randn(9, 640, generator=g).to(BF16)
    y = torch.randn(9, n, generator=g).to(BF16)
    groups = [(list(range(9)), (a, b))]
    rows, off, pointers, _keep = table(groups)
    out = lora_sgmv.add(x, y.clone(), rows, off, pointers)
    want = exact(x, y, groups)
    assert ((out.double() - want).abs() <= want.abs() * 2.0**-8 + 1e-6).all()


def test_an_adapter_whose_b_is_zero_adds_nothing() -> None:
    """peft's own initialisation (B = 0): nothing kept, nothing read, y unchanged."""
    a = torch.randn(64, 8).to(BF16)
    b = torch.zeros(8, 96, dtype=BF16)
    packed, spans = lora_sgmv.pack_b(b)
    assert packed.numel() == 1 and spans[:, :2].eq(0).all()
    y = torch.randn(3, 96).to(BF16)
    rows, off, pointers, _keep = table([([0, 2], (a, b))])
    assert torch.equal(
        lora_sgmv.add(torch.randn(3, 64).to(BF16), y.clone(), rows, off, pointers), y
    )
