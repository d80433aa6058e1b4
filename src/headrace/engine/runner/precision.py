"""Where a model runs and in what precision: the device and dtype `auto` resolves to."""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(
    name: str, device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")
) -> torch.dtype:
    """`auto`: bf16 on CUDA and on CPUs with native bf16 instructions (AVX-512 BF16 or AMX),
    where it passed the quality gate (docs/performance.md: perplexity +0.2% of fp32) and runs
    1.7x faster; fp32 elsewhere, where bf16 is emulated and slower."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16(cpuinfo)):
        return torch.bfloat16
    return torch.float32


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))
