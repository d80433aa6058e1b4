"""What structured outputs cost: output tokens/s of `headrace serve` (Gemma 3 270M) at 16
closed-loop streams with 0%, 50% and 100% of the requests under a JSON schema, in one run; and
the front end's grammar compile time for that schema, cold and cached.

Every request asks for 64 tokens with `ignore_eos`: a constrained one goes on past its JSON
with end-of-sequence tokens (the only ones its completed grammar allows), so all requests have
the same length and the figures compare steps of the same work, masks or not.

    .venv/bin/python bench/structured.py            # ~3 min
    .venv/bin/python bench/structured.py --streams 8 --requests 32

Prints JSON, writes bench/out/structured/structured.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from headrace.bench.local import free_port, wait_healthy
from headrace.bench.stats import distribution

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "structured"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "tags"],
    "additionalProperties": False,
}
SUBJECTS = ["a baker", "a pilot", "a chess player", "a fisherman", "a nurse", "a painter"]


def compile_times() -> dict[str, float]:
    """The front end's schema -> grammar (with its check), cold and then from the cache."""
    from headrace.api.structured import _grammar

    source = json.dumps(SCHEMA, sort_keys=True, separators=(",", ":"))
    t0 = time.perf_counter()
    _, error = _grammar("json", source)
    cold = time.perf_counter() - t0
    assert not error, error
    t0 = time.perf_counter()
    _grammar("json", source)
    return {"compile_cold_ms": 1e3 * cold, "compile_cached_ms": 1e3 * (time.perf_counter() - t0)}


async def level(url: str, share: float, streams: int, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    kinds = [i < round(share * n) for i in range(n)]
    rng.shuffle(kinds)
    queue = list(enumerate(kinds))
    tokens, latencies, errors = [0, 0], [], 0
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while queue:
            i, constrained = queue.pop()
            body: dict[str, Any] = {
                "prompt": f"A short profile of {rng.choice(SUBJECTS)} (#{i}), as JSON:\n",
                "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            }  # fmt: skip
            if constrained:
                body["response_format"] = fmt
            t0 = time.perf_counter()
            r = await client.post("/v1/completions", json=body)
            if r.status_code != 200:
                errors += 1
                continue
            tokens[constrained] += r.json()["usage"]["completion_tokens"]
            latencies.append(time.perf_counter() - t0)

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(streams)))
        wall = time.perf_counter() - t0
    return {
        "constrained_share": share, "requests": n, "errors": errors, "duration_s": wall,
        "output_tokens_per_s": sum(tokens) / wall, "free_tokens": tokens[0],
        "constrained_tokens": tokens[1], "latency_s": distribution(latencies),
    }  # fmt: skip


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["levels"]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [100 * r["constrained_share"] for r in rows]
    ax.bar(x, [r["output_tokens_per_s"] for r in rows], width=20)
    ax.set_xlabel("requests under a JSON schema (%)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"Gemma 3 270M, {result['streams']} streams")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--serve-args", default="", help="extra `headrace serve` flags")
    args = p.parse_args()
    port = free_port()
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(port), "--log-level",
           "warning", *args.serve_args.split()]  # fmt: skip
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 600, log)
        asyncio.run(level(url, 0.5, 4, 8, seed=99))  # warm-up: kernels, the grammar tokenizer
        rows = [
            asyncio.run(level(url, share, args.streams, args.requests, seed=int(share * 100)))
            for share in (0.0, 0.5, 1.0)
        ]
    finally:
        proc.terminate()
        proc.wait(30)
    base = rows[0]["output_tokens_per_s"]
    result = {
        "streams": args.streams, "levels": rows, **compile_times(),
        "throughput_vs_unconstrained": {
            str(r["constrained_share"]): r["output_tokens_per_s"] / base for r in rows
        },
    }  # fmt: skip
    (OUT / "structured.json").write_text(json.dumps(result, indent=1))
    plot(result, OUT / "structured.png")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
