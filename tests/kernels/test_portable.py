"""The kernels' portable C paths (what a CPU without AVX-512, without AVX-512 BF16, or without
AMX runs), built here with an older -march and checked against torch like the native build."""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from headrace.kernels import bf16_linear, block_linear, build, int8_linear, q8_head
from kernels import (
    test_argmax,
    test_bf16_linear,
    test_block_linear,
    test_fused,
    test_int8_envelope,
    test_int8_head,
    test_int8_linear,
    test_int8_screen,
    test_paged_decode,
    test_q8_head,
    test_screened_row,
)

# AVX2 only; AVX-512 without BF16 or VNNI; AVX-512 BF16 and VNNI without AMX
MARCHES = ["x86-64-v3", "skylake-avx512", "cooperlake"]
NEEDS = {"x86-64-v3": {"avx2"}, "skylake-avx512": {"avx512bw"}, "cooperlake": {"avx512_bf16"}}
# every kernel module that looks its library up: each gets the portable build
MODULES = tuple(
    importlib.import_module(f"headrace.kernels.{name}")
    for name in (
        "argmax", "bf16_linear", "block_linear", "fused", "int8_envelope", "int8_head",
        "int8_linear", "int8_screen", "paged_decode", "q8_head", "sample_draw", "screened_row",
    )
)  # fmt: skip


@pytest.fixture(scope="module", params=MARCHES)
def portable_lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The library built once per -march for the module (a build takes ~4 s)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    missing = NEEDS[request.param] - set(build._cpu_flags().split())
    if missing:
        pytest.skip(f"this CPU cannot run a {request.param} build (no {', '.join(missing)})")
    flags = [f"-march={request.param}" if f == "-march=native" else f for f in build.FLAGS]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADRACE_CACHE", str(tmp_path_factory.mktemp(request.param)))
        return request.param, build.load(
            compiler, [f for f in flags if not f.startswith("-mprefer")]
        )


@pytest.fixture
def portable(portable_lib: tuple[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    march, lib = portable_lib
    for module in MODULES:
        monkeypatch.setattr(module, "cpu_kernels", lambda lib=lib: lib)
    yield march


def test_paged_decode_portable(portable: str) -> None:
    for shape in [(4, 1, 256), (6, 2, 64), (3, 3, 8)]:
        test_paged_decode.test_kernel_matches_gathered_sdpa(*shape, torch.bfloat16)
        test_paged_decode.test_kernel_matches_gathered_sdpa(*shape, torch.float32)


def test_argmax_and_head_portable(portable: str) -> None:
    test_argmax.test_ties_infinities_and_nan(torch.bfloat16)
    test_argmax.test_random_rows(torch.float32, 1025)
    for rows in (1, 3, 6, 17):
        for hidden in (96, 128):
            test_int8_head.test_random_head_every_row_count(rows, hidden)
    test_int8_screen.test_one_limb_is_exact(5, 96)
    test_int8_envelope.test_bounds_hold_in_float64(4, 96, True)


def test_fused_portable(portable: str) -> None:
    test_fused.test_gelu_tanh_mul(1000)
    test_fused.test_silu_mul()
    test_fused.test_rms_norm_rows(True)
    test_fused.test_rms_norm_rows(False)
    test_fused.test_rms_norm_with_residual()
    test_fused.test_rope_equals_torch_bit_for_bit(3, 128, 64)
    test_fused.test_rope_equals_torch_bit_for_bit(2, 24, 24)


def test_int8_linear_portable(portable: str) -> None:
    if not int8_linear.int8_dot_cpu():
        pytest.skip("no int8 dot products on this CPU: the int8 path is never taken")
    test_int8_linear.test_quantize_rows_matches_torch(37, 100, 40)
    test_int8_linear.test_quantize_zero_row_and_strided_input()
    test_int8_linear.test_int8_linear_equals_its_quantized_operands_product(33)
    test_int8_linear.test_bias_is_added()


def test_bf16_linear_portable(portable: str) -> None:
    weight = torch.zeros(64, 2, dtype=torch.bfloat16)
    if portable != "cooperlake":  # no AVX-512 BF16: the layers keep oneDNN
        assert not bf16_linear.supported(weight)
        return
    assert bf16_linear.supported(weight)
    for rows in (1, 6, 16):
        test_bf16_linear.test_every_row_count_is_one_rounding_from_exact(rows)
    test_bf16_linear.test_bias_strided_rows_and_odd_shapes()


def test_screened_row_portable(portable: str) -> None:
    for case in test_screened_row.CASES:
        test_screened_row.test_the_head_is_the_likeliest_buckets_and_the_sums_agree(*case)
    test_screened_row.test_rows_dot_is_the_fp32_dot_of_the_chosen_rows(300)


def test_block_linear_portable(portable: str) -> None:
    if portable != "cooperlake":  # no AVX-512 BF16: the layers keep their bf16 weights
        assert not block_linear.supported(64, 32, 32)
        return
    assert block_linear.supported(64, 32, 32)
    for rows in (1, 3):
        test_block_linear.test_every_row_count_is_one_rounding_from_the_blocks_weights(rows, 16, 63)
    test_block_linear.test_bias_and_strided_rows()


def test_q8_head_portable(portable: str) -> None:
    if portable != "cooperlake":  # no AVX-512 BF16: the head keeps its bf16 weights
        assert not q8_head.supported(16, 32)
        return
    assert q8_head.supported(16, 32)
    for rows in (1, 4):
        test_q8_head.test_every_row_count_is_the_blocks_product_in_fp32(rows)
    test_q8_head.test_rows_are_their_own_and_strided_rows_read_in_place()
