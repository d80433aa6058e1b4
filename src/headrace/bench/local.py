"""Servers the bench scripts start on this machine: a free loopback port, and waiting until a
started server answers `/health` (or says why it never will)."""

from __future__ import annotations

import socket
import subprocess
import time
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
