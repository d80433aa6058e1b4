"""Cache entries that any number of processes and threads may build at once: one builds, under
a lock beside the entry, into a temporary name of its own; the rest wait and then read its
result. An entry appears whole (fsynced, then renamed into place) or not at all.

The lock is `fcntl.flock` on `.<entry>.lock`: the kernel drops it when its holder dies, so a
builder killed half way blocks nobody, and the next holder deletes the temporaries it left.
Lock files stay (deleting one would let two holders lock two different files).
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Hold `entry`'s lock. Each call opens the file anew, so threads of one process exclude
    each other too (flock belongs to the open file, not the process)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(entry.with_name(f".{entry.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def temp_path(entry: Path, tag: str = "") -> Path:
    """A name beside `entry` that no other process or thread uses at the same time."""
    return entry.with_name(f".{entry.name}.{os.getpid()}.{threading.get_native_id()}{tag}.tmp")


def clear_temps(entry: Path) -> None:
    """Delete `entry`'s temporaries. Call it holding the lock: any found then were left by a
    holder that died."""
    for path in glob.glob(glob.escape(str(entry.parent / f".{entry.name}.")) + "*.tmp"):
        _remove(Path(path))


def publish(temp: Path, entry: Path) -> None:
    """Rename a finished file or directory at `temp` into place as `entry`, its data on disk
    first. A directory replaces a broken `entry` (no reader trusts it) by moving it aside before
    deleting it: a process that opened files in it keeps them."""
    _fsync_tree(temp)
    aside = temp_path(entry, ".old")
    if temp.is_dir() and entry.exists():
        os.replace(entry, aside)
    os.replace(temp, entry)
    _fsync(entry.parent)
    _remove(aside)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            _fsync_tree(child)
    _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
