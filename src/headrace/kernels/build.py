"""Compile `cpu_kernels.c`, `paged_decode.c`, `int8_head.c`, `int8_screen.c`, `int8_linear.c`,
`int8_small.c`, `bf16_linear.c`, `block_linear.c`, `q8_head.c`, `sample_draw.c`,
`screened_row.c` and `lora_sgmv.c` with the machine's C compiler once, cache the library, load it.

A plain C library through ctypes rather than a torch C++ extension: it builds in about 0.4 s
(no torch headers), so the first start ever stays fast, and a later start loads it from the
cache. ctypes releases the GIL during each call, so the front end's thread keeps running.
`-march=native`: the library is built on, and for, the machine that runs it.

Without a compiler (or with `HEADRACE_CPU_KERNELS=0`) `cpu_kernels()` is None and callers take
their torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch  # noqa: F401  (loaded first: the library then shares torch's OpenMP runtime)

from headrace.cache_files import clear_temps, locked, publish, temp_path
from headrace.paths import cache_root

log = logging.getLogger(__name__)
NAMES = (
    "cpu_kernels.c",
    "paged_decode.c",
    "int8_head.c",
    "int8_screen.c",
    "int8_linear.c",
    "int8_small.c",
    "bf16_linear.c",
    "block_linear.c",
    "q8_head.c",
    "sample_draw.c",
    "screened_row.c",
    "lora_sgmv.c",
)
SOURCES = [Path(__file__).with_name(n) for n in NAMES]
# included by the sources: part of the cache key
HEADER_NAMES = ("bf16.h", "fast_exp.h", "head_cands.h", "head_envelope.h")
HEADERS = [Path(__file__).with_name(n) for n in HEADER_NAMES]
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC"]
I64, F32, PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


def switched_on(var: str) -> bool:
    """An on/off environment switch, on unless set to 0 / false / no / off."""
    return os.environ.get(var, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def cpu_kernels() -> ctypes.CDLL | None:
    """The loaded library, or None where it cannot be built here."""
    if not switched_on("HEADRACE_CPU_KERNELS"):
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: CPU kernels off, torch paths used")
        return None
    try:
        return load(compiler, FLAGS)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("CPU kernels unavailable (%s): torch paths used", e)
        return None


def load(compiler: str, flags: list[str]) -> ctypes.CDLL:
    """Build with `flags` (tests build the portable paths with an older -march) and load."""
    lib = ctypes.CDLL(str(_built(compiler, flags)))
    _declare(lib)
    return lib


def _built(compiler: str, flags: list[str] = FLAGS) -> Path:
    source = b"".join(p.read_bytes() for p in [*SOURCES, *HEADERS])
    # -march=native: a cache shared by machines of other CPUs must not hand them this build
    ident = source + compiler.encode() + " ".join(flags).encode() + _cpu_flags().encode()
    key = hashlib.sha256(ident).hexdigest()[:16]
    target = cache_root() / "kernels" / f"cpu_kernels-{key}.so"
    if _intact(target):
        return target
    # Replicas starting together: one compiles, the others wait for its library.
    with locked(target):
        if not _intact(target):
            _compile(compiler, flags, target)
    return target


def _intact(target: Path) -> bool:
    """Whether the library is the one built: loading one cut short kills the process (SIGBUS).
    Its sha256 (~90 KB) costs well under a millisecond."""
    try:
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        return digest == _digest_file(target).read_text()
    except OSError:
        return False


def _compile(compiler: str, flags: list[str], target: Path) -> None:
    clear_temps(target)
    clear_temps(_digest_file(target))
    tmp, tmp_digest = temp_path(target), temp_path(_digest_file(target))
    try:
        _build_into(compiler, flags, tmp)
        tmp_digest.write_text(hashlib.sha256(tmp.read_bytes()).hexdigest())
        publish(tmp_digest, _digest_file(target))
        publish(tmp, target)  # a process that loaded the old file keeps it
    finally:
        tmp.unlink(missing_ok=True)
        tmp_digest.unlink(missing_ok=True)
    log.info("built CPU kernels %s", target)


def _build_into(compiler: str, flags: list[str], out: Path) -> None:
    """Each source compiled on its own, all at once, then linked into `out`: 3.9 s in one
    command on 2 cores, about half that so (a first start waits for it)."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        per_file = [f for f in flags if f != "-shared"]

        def compile_one(source: Path, obj: Path) -> None:
            command = [compiler, *per_file, "-c", "-o", str(obj), str(source)]
            subprocess.run(command, check=True, capture_output=True, timeout=120)

        with ThreadPoolExecutor(max_workers=len(SOURCES)) as pool:
            for done in [
                pool.submit(compile_one, s, o) for s, o in zip(SOURCES, objects, strict=True)
            ]:
                done.result()  # the first failure raises
        command = [compiler, *flags, "-o", str(out), *map(str, objects), "-lm"]
        subprocess.run(command, check=True, capture_output=True, timeout=120)


def _digest_file(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _declare(lib: ctypes.CDLL) -> None:
    # Long on purpose: a flat table of ctypes signatures, one kernel after another.
    for name in ("paged_decode_bf16", "paged_decode_f32"):
        fn = getattr(lib, name)
        fn.argtypes = [PTR, PTR, PTR, PTR, I64, PTR, PTR, PTR, I64, I64, I64, I64, I64, F32, PTR]
        fn.restype = ctypes.c_int
    lib.head_argmax_q8.argtypes = [PTR, I64, I64, PTR, PTR, PTR, PTR, I64, PTR, I64, PTR]
    lib.head_argmax_q8.restype = None
    lib.head_envelope_q8.argtypes = [PTR, I64, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR, I64, I64]
    lib.head_envelope_q8.argtypes += [PTR, PTR, PTR, PTR, PTR, PTR]
    lib.head_envelope_q8.restype = None
    lib.head_bounds_q8.argtypes = [PTR, I64, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR, I64, PTR]
    lib.head_bounds_q8.argtypes += [PTR, I64, PTR, PTR]
    lib.head_bounds_q8.restype = None
    lib.head_argmax_q8_outliers.argtypes = [PTR, I64, I64, PTR, I64, PTR, PTR, PTR, PTR, PTR]
    lib.head_argmax_q8_outliers.argtypes += [I64, PTR, I64, I64, PTR]
    lib.head_argmax_q8_outliers.restype = I64
    lib.linear_bf16.argtypes = [PTR, I64, I64, I64, PTR, I64, PTR, PTR]
    lib.linear_bf16.restype = None
    lib.linear_q8.argtypes = [PTR, PTR, I64, I64, PTR, PTR, PTR, I64, PTR, PTR]
    lib.linear_q8.restype = None
    lib.linear_blocks.argtypes = [PTR, I64, I64, I64, I64, I64, PTR, I64, PTR, PTR]
    lib.linear_blocks.restype = ctypes.c_int
    lib.q8_head.argtypes = [PTR, I64, I64, I64, PTR, I64, PTR]
    lib.q8_head.restype = ctypes.c_int
    lib.lora_sgmv_bf16.argtypes = [PTR, I64, I64, PTR, I64, I64, I64, PTR, PTR, PTR, PTR, PTR, PTR]
    lib.lora_sgmv_bf16.restype = ctypes.c_int
    supported = (
        "linear_bf16_supported",
        "linear_q8_supported",
        "linear_blocks_supported",
        "q8_head_supported",
        "lora_sgmv_supported",
    )
    for name in ("head_q8_vnni", "head_q8_amx", *supported):
        fn = getattr(lib, name)
        fn.argtypes = []
        fn.restype = ctypes.c_int
    lib.quantize_rows_u8.argtypes = [PTR, I64, I64, I64, I64, PTR, PTR]
    lib.quantize_rows_u8.restype = None
    lib.scale_rows_bf16.argtypes = [PTR, I64, I64, PTR, PTR]
    lib.scale_rows_bf16.restype = None
    lib.act_mul_bf16.argtypes = [PTR, I64, I64, I64, ctypes.c_int, PTR]
    lib.act_mul_bf16.restype = None
    lib.rms_norm_bf16.argtypes = [PTR, I64, I64, I64, I64, PTR, I64, ctypes.c_int, F32, PTR, PTR]
    lib.rms_norm_bf16.restype = None
    lib.rope_bf16.argtypes = [PTR, I64, I64, I64, I64, PTR, PTR, I64, PTR]
    lib.rope_bf16.restype = None
    lib.sample_draw.argtypes = [PTR, ctypes.c_int, I64, I64, I64, PTR, PTR, PTR, PTR, PTR]
    lib.sample_draw.restype = None
    lib.screened_row_head.argtypes = [PTR, PTR, I64, F32, I64, PTR, PTR, PTR, PTR, PTR, PTR]
    lib.screened_row_head.restype = I64
    lib.rows_dot_bf16.argtypes = [PTR, I64, PTR, I64, PTR, I64, PTR]
    lib.rows_dot_bf16.restype = None
    for name in ("argmax_bf16", "argmax_f32"):
        fn = getattr(lib, name)
        fn.argtypes = [PTR, I64, I64, PTR]
        fn.restype = None
    for name in ("token_mask_bf16", "token_mask_f32"):
        fn = getattr(lib, name)
        fn.argtypes = [PTR, I64, PTR, I64, PTR, I64]
        fn.restype = None
