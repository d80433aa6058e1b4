"""How fast does "overloaded" arrive? 200 requests at once against `--max-queued-requests 16`.

Starts `headrace serve` (default: the embedded Gemma 3 270M) with a tenants file of one tenant
and a queue bound, opens all connections first, then sends every request in one burst over raw
sockets (a lean client, so that the load generator itself adds little) while probing /health
every 20 ms. Reports the time from a request's last byte sent to its status line, for the 503s
(p50/p99) and the admitted ones, how many got which status, whether each 503 had Retry-After,
and /health latency during the burst. Prints JSON and writes it with a PNG (latency CDFs).

    .venv/bin/python bench/rejection.py                     # this checkout
    .venv/bin/python bench/rejection.py --src /tmp/old/src  # another checkout (before/after)
    .venv/bin/python bench/rejection.py --rounds 3 --src-b /tmp/old/src   # alternating A/B
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headrace.bench.local import free_port, wait_healthy
from headrace.bench.stats import percentile
from headrace.gateway.auth import hash_key

KEY = "bench-key"
PROMPT = " ".join(["The mill wheel turns as the water in the headrace flows."] * 8)


def start(src: str | None, args: argparse.Namespace, workdir: Path) -> tuple[Any, str]:
    tenants = workdir / "tenants.yaml"
    tenants.write_text(f"tenants:\n  bench:\n    api_key_sha256: [{hash_key(KEY)}]\n")
    port = free_port()
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(port),
           "--tenants", str(tenants), "--max-queued-requests", str(args.queue_bound),
           "--log-level", "warning", *args.serve_args]  # fmt: skip
    log = (workdir / f"serve-{port}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log=workdir / f"serve-{port}.log")
    return proc, url


def request_bytes(port: int, max_tokens: int) -> bytes:
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> tuple[int, float, bool]:
    """Send `data`, return (status, seconds to the whole response head, Retry-After there?).
    The head is read in as few calls as the kernel hands it over, so that the client's own
    work on 200 answers adds little to the latency it measures."""
    writer.write(data)
    await writer.drain()
    t0 = time.perf_counter()
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await reader.read(65536)
        if not chunk:
            break
        head += chunk
    elapsed = time.perf_counter() - t0
    writer.close()  # an admitted request is aborted: its client is gone
    parts = head.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 else 0
    return status, elapsed, b"\r\nretry-after:" in head.lower()


async def probe_health(port: int, stop: asyncio.Event, out: list[float]) -> None:
    req = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while not stop.is_set():
        t0 = time.perf_counter()
        writer.write(req)
        await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.02)
    writer.close()


async def burst(url: str, n: int, max_tokens: int) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    data = request_bytes(port, max_tokens)
    health: list[float] = []
    stop = asyncio.Event()
    prober = asyncio.create_task(probe_health(port, stop, health))
    await asyncio.sleep(0.2)
    results = await asyncio.gather(*(one(r, w, data) for r, w in conns))
    stop.set()
    await prober
    refused = [t for s, t, _ in results if s == 503]
    admitted = [t for s, t, _ in results if s == 200]
    statuses: dict[str, int] = {}
    for s, _, _ in results:
        statuses[str(s)] = statuses.get(str(s), 0) + 1
    ms = lambda xs, q: round(percentile(xs, q) * 1000, 1) if xs else None  # noqa: E731
    return {
        "statuses": statuses,
        "rejection_ms": {"p50": ms(refused, 50), "p99": ms(refused, 99), "max": ms(refused, 100)},
        "admitted_first_byte_ms": {"p50": ms(admitted, 50), "p99": ms(admitted, 99)},
        "retry_after_on_every_503": all(ra for s, _, ra in results if s == 503),
        "health_ms": {"p50": ms(health, 50), "p99": ms(health, 99), "n": len(health)},
        "_refused": refused,
        "_health": health,
    }


def run_one(src: str | None, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    proc, url = start(src, args, workdir)
    try:
        asyncio.run(burst(url, 8, args.max_tokens))  # warm-up: the model's first steps
        time.sleep(2)
        return asyncio.run(burst(url, args.requests, args.max_tokens))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def plot(runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, results in runs.items():
        for i, r in enumerate(results):
            for ax, key in zip(axes, ("_refused", "_health"), strict=True):
                xs = sorted(v * 1000 for v in r[key])
                ys = [(k + 1) / len(xs) for k in range(len(xs))]
                ax.plot(xs, ys, label=f"{label} #{i + 1}")
    axes[0].set(title="503 latency (send -> status line)", xlabel="ms", ylabel="CDF")
    axes[1].set(title="/health latency during the burst", xlabel="ms")
    for ax in axes:
        ax.set_xscale("log")
        ax.axvline(50, color="grey", linestyle=":")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--src", default=None, help="src/ of the checkout to serve (default: this)")
    p.add_argument("--src-b", default=None, help="a second checkout to compare, alternating")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--queue-bound", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench/out/rejection"))
    p.add_argument("serve_args", nargs="*", help="extra `headrace serve` flags (after --)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    labels = {"a": args.src or "this checkout"}
    if args.src_b:
        labels["b"] = args.src_b
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in labels.values()}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for key, label in labels.items():
                src = args.src if key == "a" else args.src_b
                print(f"round {r + 1}: {label}", file=sys.stderr)
                runs[label].append(run_one(src, args, Path(tmp)))
    plot(runs, args.out / "rejection.png")
    report = {k: [{x: y for x, y in r.items() if not x.startswith("_")} for r in v]
              for k, v in runs.items()}  # fmt: skip
    text = json.dumps({"requests": args.requests, "queue_bound": args.queue_bound,
                       "runs": report}, indent=2)  # fmt: skip
    (args.out / "rejection.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
