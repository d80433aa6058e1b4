"""Building and turning off the CPU kernels."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from headrace.kernels import build
from headrace.kernels.argmax import argmax_rows


def test_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("HEADRACE_CACHE", str(tmp_path))
    first = build._built(compiler)
    assert first.parent == tmp_path / "kernels" and first.exists()
    assert list(first.parent.iterdir()) == [first]  # no temporary left behind
    mtime = first.stat().st_mtime_ns
    assert build._built(compiler) == first and first.stat().st_mtime_ns == mtime


def test_off_switch_gives_the_torch_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_CPU_KERNELS", "0")
    build.cpu_kernels.cache_clear()
    try:
        assert build.cpu_kernels() is None
        x = torch.randn(3, 50)
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))  # torch's own path
    finally:
        monkeypatch.delenv("HEADRACE_CPU_KERNELS")
        build.cpu_kernels.cache_clear()
