"""Suite-wide pytest set-up, shared by every helper: only add to it.

Having this file puts `tests/` on `sys.path`, so helper modules of a test package import the
same way from anywhere in the suite: `from factories import make_tiny` (tests/factories/).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import tempfile
from collections.abc import Iterator

import pytest

pytest_plugins = ["netns", "hf_gemma"]


def pytest_configure(config: pytest.Config) -> None:
    """Servers the tests start keep their usage ledger (on by default, in the state directory)
    in a directory of this run, never in the user's ~/.local/state."""
    if "HEADRACE_STATE" not in os.environ:
        os.environ["HEADRACE_STATE"] = tempfile.mkdtemp(prefix="headrace-test-state-")
    workers = config.getoption("numprocesses", None)  # pytest-xdist's -n
    if isinstance(workers, int) and workers > 1:
        _share_the_cores()


def _share_the_cores() -> None:
    """Several processes of the suite on a machine's few cores: one OpenMP thread each, and
    OpenMP threads that sleep when they wait, for them and the servers they start (a server
    still runs a thread per core: --num-threads). A waiting thread spins by default, holding the
    core its late partner needs: 20 Gemma chats that take 10 s alone took 288 s beside one busy
    process, 15 s with passive waits (docs/performance.md)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test (its fixtures now closed), hand the memory it freed back to
    the system: glibc keeps freed tensors' pages in its heap otherwise, and a process of the
    suite that ran the Gemma modules held 5-6 GB to the end, beside Ray's tests, whose memory
    monitor kills actors when the machine is 95% full."""
    yield
    if nextitem is not None and nextitem.path == item.path:
        return
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
