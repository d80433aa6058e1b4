"""What a running batch costs interactive traffic: TTFT of paid requests with and without one.

Starts `headrace serve --tenants` on 127.0.0.1 (Gemma 3 270M unless `--model`) with a paid
tenant and a batch tenant, then two phases of `--phase-s` seconds each, the same interactive
closed loop in both (`--clients` streams of the paid tenant, `--max-tokens` each):

- `alone`: nothing else runs;
- `with_batch`: the batch tenant's `--lines`-line batch (`/v1/completions`, `--batch-max-tokens`
  each) is submitted first and keeps running through the phase.

Prints JSON (TTFT p50/p95/max in ms and requests per phase, the batch's lines finished during
its phase) and writes it to `--out` (bench/out/batch_interference.json). docs/batches.md reports
it.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from headrace.bench.local import serving
from headrace.gateway.auth import hash_key

OUT = Path(__file__).resolve().parent / "out"
KEYS = {"acme": "paid", "nightly": "batch"}  # tenant -> tier; a tenant's key is its name


def tenants_yaml() -> str:
    lines = ["tenants:"]
    for name, tier in KEYS.items():
        lines.append(f"  {name}: {{tier: {tier}, api_key_sha256: [{hash_key(name)}]}}")
    return "\n".join(lines) + "\n"


def ttft_s(client: httpx.Client, max_tokens: int) -> float:
    """One streamed paid completion; seconds to its first content event."""
    body = {"prompt": "Tell me about rivers.", "max_tokens": max_tokens, "stream": True}
    t0, first = time.monotonic(), None
    with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():  # read to the end: a closed loop
            if first is None and has_text(line):
                first = time.monotonic() - t0
    if first is None:
        raise RuntimeError("the stream ended without content")
    return first


def has_text(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
    return bool(choices[0].get("text"))


def interactive(url: str, clients: int, seconds: float, max_tokens: int) -> list[float]:
    """`clients` closed-loop paid streams for `seconds`; every request's TTFT."""
    out: list[float] = []
    stop = time.monotonic() + seconds

    def loop() -> None:
        headers = {"authorization": "Bearer acme"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            while time.monotonic() < stop:
                out.append(ttft_s(c, max_tokens))

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def start_batch(url: str, lines: int, max_tokens: int) -> tuple[openai.OpenAI, str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="nightly", timeout=120)
    requests = [
        {"custom_id": f"n{i}", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": f"Summary {i}:", "max_tokens": max_tokens, "ignore_eos": True}}
        for i in range(lines)
    ]  # fmt: skip
    data = "".join(json.dumps(r) + "\n" for r in requests).encode()
    f = client.files.create(file=("nightly.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
    )
    return client, batch.id


def summary(ttfts: list[float]) -> dict[str, Any]:
    ms = sorted(x * 1000 for x in ttfts)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return {"requests": len(ms), "ttft_p50_ms": round(statistics.median(ms), 1),
            "ttft_p95_ms": round(p95, 1), "ttft_max_ms": round(ms[-1], 1)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model to serve (default: the embedded Gemma 3 270M)")
    p.add_argument("--phase-s", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--batch-max-tokens", type=int, default=128)
    p.add_argument("--batch-concurrency", type=int, default=8)
    p.add_argument("--serve-args", default="", help="more `headrace serve` flags, e.g. "
                   "'--background-priority 10' (batch lines never sit a step out)")  # fmt: skip
    p.add_argument("--out", default=str(OUT / "batch_interference.json"))
    args = p.parse_args()
    out = Path(args.out).resolve()  # before the server's working directory
    with tempfile.TemporaryDirectory(prefix="headrace-batch-bench-") as tmp:
        work = Path(tmp)
        (work / "tenants.yaml").write_text(tenants_yaml())
        flags = [
            "--tenants",
            str(work / "tenants.yaml"),
            "--batch-dir",
            str(work / "batches"),
            "--batch-concurrency",
            str(args.batch_concurrency),
            "--log-level",
            "warning",
        ]
        flags += ["--model", args.model] if args.model else []  # fmt: skip
        flags += args.serve_args.split()
        with serving(flags, work) as url:
            interactive(url, args.clients, 3.0, args.max_tokens)  # warm up
            alone = interactive(url, args.clients, args.phase_s, args.max_tokens)
            client, batch_id = start_batch(url, args.lines, args.batch_max_tokens)
            before = client.batches.retrieve(batch_id).request_counts
            beside = interactive(url, args.clients, args.phase_s, args.max_tokens)
            after = client.batches.retrieve(batch_id)
            client.batches.cancel(batch_id)
    done_before = before.completed if before is not None else 0
    counts = after.request_counts
    result = {
        "alone": summary(alone), "with_batch": summary(beside),
        "batch": {"lines": args.lines, "status_at_end": after.status,
                  "lines_finished_in_phase": (counts.completed if counts else 0) - done_before},
        "settings": vars(args),
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
