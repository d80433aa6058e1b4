"""Calls made at the same moment by several threads or processes (the cache's race tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# A child imports, says it is ready, waits for the go file, then runs the body.
PRELUDE = """
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
pathlib.Path(sys.argv[1] + "." + sys.argv[2]).touch()
while not go.exists():
    time.sleep(0.005)
"""


def in_threads(fn: Callable[[], T], n: int) -> list[T | BaseException]:
    """`fn()` in `n` threads released together: each one's result or exception."""
    barrier = threading.Barrier(n)
    results: list[T | BaseException] = [RuntimeError("did not run")] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001  (reported to the test, which fails on it)
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def in_processes(
    imports: str, body: str, n: int, env: dict[str, str], directory: Path, timeout: float = 300
) -> list[subprocess.CompletedProcess[str]]:
    """`python -c` of `imports` then `body` in `n` processes, `body` started in all of them at
    once (after every one has imported); `env` adds to this process's environment."""
    go = directory / "go"
    code = imports + PRELUDE + body
    full_env = {**os.environ, **env}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
        )
        for i in range(n)
    ]
    deadline = time.monotonic() + timeout
    while not all(Path(f"{go}.{i}").exists() for i in range(n)):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, "children not ready"
        time.sleep(0.01)
    go.touch()
    done = []
    for p in procs:
        out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done
