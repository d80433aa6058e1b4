"""Servers the bench scripts start on this machine: a free loopback port, waiting until a
started server answers `/health` (or says why it never will), and a server for a block."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from headrace.bench import BenchError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes], timeout: float = 600.0, log: Path | None = None
) -> None:
    """Returns once `url/health` answers 200; raises BenchError if `proc` exits or time runs out."""
    where = f"; see {log}" if log else ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"server exited with {proc.returncode}{where}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise BenchError(f"server not healthy after {timeout:.0f} s{where}")


@contextlib.contextmanager
def serving(flags: list[str], workdir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`headrace serve --port P *flags` until the block ends (SIGTERM, then kill); yields its
    URL. Its log goes to `workdir`; a server that never gets healthy ends the script with it."""
    port = free_port()
    cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(port), *flags]
    log_path = workdir / f"serve-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, proc, log=log_path)
        except BenchError as exc:
            raise SystemExit(f"server did not start ({exc}):\n{log_path.read_text()}") from None
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
