"""Building and turning off the CPU kernels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories.processes import in_processes

from headrace.kernels import build
from headrace.kernels.argmax import argmax_rows

# The cache, lock and rebuild logic does not depend on how hard the compiler optimizes: the
# library built without optimization (same sources, same symbols, loadable) takes 2 s on 2
# cores instead of 5. Every library the server itself loads is built with build.FLAGS.
QUICK = ["-O0" if f == "-O3" else f for f in build.FLAGS]


def only_the_entry(lib: Path) -> bool:
    """The library, its digest and its lock file: no temporary left behind."""
    names = sorted(p.name for p in lib.parent.iterdir())
    return names == [f".{lib.name}.lock", lib.name, f"{lib.name}.sha256"]


def test_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("HEADRACE_CACHE", str(tmp_path))
    first = build._built(compiler, QUICK)
    assert first.parent == tmp_path / "kernels" and first.exists()
    assert only_the_entry(first)
    mtime = first.stat().st_mtime_ns
    assert build._built(compiler, QUICK) == first and first.stat().st_mtime_ns == mtime


def compiler_or_skip() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    return compiler


def test_replicas_starting_together_build_it_once(tmp_path: Path) -> None:
    compiler = compiler_or_skip()
    imports = "import logging\nfrom headrace.kernels import build\n"
    body = f"logging.basicConfig(level=logging.INFO)\nprint(build._built({compiler!r}, {QUICK!r}))"
    done = in_processes(imports, body, 3, {"HEADRACE_CACHE": str(tmp_path / "c")}, tmp_path)
    assert [d.returncode for d in done] == [0, 0, 0], [d.stderr[-2000:] for d in done]
    (path,) = {d.stdout.strip() for d in done}
    assert sum(d.stderr.count("built CPU kernels") for d in done) == 1
    assert only_the_entry(Path(path))


def test_a_cut_short_library_is_built_again(tmp_path: Path) -> None:
    """Loading a cut-short library would kill the process (SIGBUS): a child process loads."""
    compiler = compiler_or_skip()
    env = {**os.environ, "HEADRACE_CACHE": str(tmp_path)}
    code = f"from headrace.kernels import build\nbuild.load({compiler!r}, {QUICK!r})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    (path,) = (tmp_path / "kernels").glob("*.so")
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    again = subprocess.run([sys.executable, "-c", code], env=env)
    assert again.returncode == 0
    assert only_the_entry(path)


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
