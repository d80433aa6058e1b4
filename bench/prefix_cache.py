"""Prefix caching on chat-like traffic: Headrace with the cache on vs off, vLLM CPU with its
prefix caching on, and two replicas routed cache-aware vs least-load — in one run.

Workloads (plain-word prompts, about one token per word with Gemma's tokenizer):
- `chat`: 8 system prompts of ~1,000 words; each request is one of them (picked at random)
  followed by a user turn of 20-60 words, answered with 64 tokens (ignore_eos).
- `multiturn`: each stream holds a conversation on one system prompt: turn k sends the system
  prompt, the k-1 earlier user turns with the answers the server gave, and a new user turn;
  after 4 turns it starts a new conversation.
Every level and server draws its own system prompts, so each starts with a cold cache.
Closed loop: N streams, each sending its next request when the last one ended.

    .venv/bin/python bench/prefix_cache.py                       # everything (~20 min)
    .venv/bin/python bench/prefix_cache.py --servers on,off --levels 16 --no-routing

Prints JSON, writes bench/out/prefix_cache/prefix_cache.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
import compare  # noqa: E402  (bench/peers/compare.py: peers, the model export)

from headrace.bench.client import Target, make_client, send  # noqa: E402
from headrace.bench.local import free_port, wait_healthy  # noqa: E402
from headrace.bench.preflight import preflight  # noqa: E402
from headrace.bench.stats import RequestResult, Slo, summarize  # noqa: E402
from headrace.bench.workloads import RequestSpec, make_prompt  # noqa: E402

SYSTEM_WORDS, NUM_SYSTEMS, OUTPUT_TOKENS, TURNS = 1000, 8, 64, 4
SERVERS = {  # name -> (kind, extra flags)
    "on": ("headrace", []),
    "off": ("headrace", ["--no-enable-prefix-caching"]),
    "vllm": ("vllm", ["--enable-prefix-caching"]),
}


class Conversations:
    """Requests of one workload at one level; `next(stream)` is that stream's next prompt."""

    def __init__(self, kind: str, seed: int) -> None:
        self.kind = kind
        self.rng = random.Random(seed)
        self.systems = [make_prompt(self.rng, SYSTEM_WORDS) for _ in range(NUM_SYSTEMS)]
        self.history: dict[int, list[str]] = {}  # stream -> system prompt and turns so far

    def next(self, stream: int) -> str:
        user = "\nUser: " + make_prompt(self.rng, self.rng.randint(20, 60)) + "\nAssistant:"
        turns = self.history.get(stream)
        if self.kind == "chat" or turns is None or len(turns) > TURNS:
            turns = [self.rng.choice(self.systems)]
        turns.append(user)
        self.history[stream] = turns
        return "".join(turns)

    def answered(self, stream: int, text: str) -> None:
        self.history[stream][-1] += text


async def run_level(target: Target, kind: str, streams: int, n: int, seed: int) -> dict[str, Any]:
    convs = Conversations(kind, seed)
    counter = itertools.count()
    results: list[RequestResult] = []
    async with make_client(target) as client:
        t0 = time.perf_counter()

        async def worker(stream: int) -> None:
            while (i := next(counter)) < n:
                prompt = convs.next(stream)
                spec = RequestSpec(i, prompt, len(prompt.split()), OUTPUT_TOKENS, kind=kind)
                result = await send(client, target, spec, t0)
                results.append(result)
                convs.answered(stream, result.text)

        await asyncio.gather(*(worker(s) for s in range(streams)))
        duration = time.perf_counter() - t0
    s = summarize(results, duration, Slo())
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    return {
        "workload": kind, "streams": streams, "requests": n, "completed": s["completed"],
        "output_tokens_per_s": s["output_tokens_per_s"], "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p95_s": s["ttft_s"]["p95"], "tpot_p50_s": s["tpot_s"]["p50"],
        "prompt_tokens_mean": prompt / len(ok) if ok else None,
        "cached_share": cached / prompt if prompt else None,
        "cached_reported": any(r.cached_tokens is not None for r in ok),
    }  # fmt: skip


def start(kind: str, flags: list[str], args: argparse.Namespace) -> tuple[Any, str, Path]:
    port = free_port()
    if kind == "headrace":
        cmd = [str(compare.VENV_BIN / "headrace"), "serve", "--port", str(port), *flags]
    else:
        hf = compare.ensure_hf_dir(Path(args.hf_dir), args.gguf)
        cmd = ["bash", str(HERE / "peers" / "run_vllm.sh"), str(hf), str(port), *flags]
    compare.WORK.mkdir(parents=True, exist_ok=True)
    log = compare.WORK / f"prefix-{kind}-{port}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 900, log)
    return proc, url, log


async def measure(url: str, name: str, levels: list[int], args: argparse.Namespace) -> list[dict]:
    target = await preflight(Target(url=url, timeout=900))
    await run_level(target, "chat", 2, 2, seed=999)  # warm-up: kernels, first allocations
    rows = []
    for kind in args.workloads:
        for level in levels:
            n = max(args.min_requests, args.rounds * level)
            row = await run_level(
                target, kind, level, n, seed=zlib.crc32(f"{kind}:{level}".encode())
            )
            print(f"{name} {kind} @ {level}: {json.dumps(row)}", file=sys.stderr)
            rows.append(row)
    return rows


def run_server(name: str, flags: list[str], levels: list[int], args: argparse.Namespace) -> Any:
    kind = SERVERS[name][0] if name in SERVERS else "headrace"
    proc, url, log = start(kind, flags, args)
    try:
        return {"flags": flags, "levels": asyncio.run(measure(url, name, levels, args))}
    finally:
        compare.stop(proc)


def ratios(servers: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """Per workload and level: b's TTFT p50 over a's, and a's tokens/s over b's."""
    out = {}
    for ra, rb in zip(servers[a]["levels"], servers[b]["levels"], strict=True):
        key = f"{ra['workload']}@{ra['streams']}"
        out[key] = {
            "ttft_p50_ratio": rb["ttft_p50_s"] / ra["ttft_p50_s"] if ra["ttft_p50_s"] else None,
            "throughput_ratio": ra["output_tokens_per_s"] / rb["output_tokens_per_s"],
        }
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = result["workloads"]
    fig, axes = plt.subplots(2, len(kinds), figsize=(5.5 * len(kinds), 7.5), squeeze=False)
    for col, kind in enumerate(kinds):
        for name, data in result["servers"].items():
            rows = [r for r in data["levels"] if r["workload"] == kind]
            x = [r["streams"] for r in rows]
            axes[0][col].plot(x, [r["output_tokens_per_s"] for r in rows], "o-", label=name)
            axes[1][col].plot(x, [r["ttft_p50_s"] for r in rows], "s--", label=name)
        for row, (title, unit) in enumerate((("output tokens/s", "tok/s"), ("TTFT p50", "s"))):
            ax = axes[row][col]
            ax.set_title(f"{kind}: {title}")
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(unit)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[1][col].set_yscale("log")
    fig.suptitle("Prefix caching, Gemma 3 270M, 8 system prompts of ~1,000 words")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--servers", default="on,off,vllm", help="of: on, off, vllm")
    p.add_argument("--levels", default="1,8,16")
    p.add_argument("--workloads", default="chat,multiturn")
    p.add_argument("--rounds", type=int, default=3, help="requests per level = rounds x streams")
    p.add_argument("--min-requests", type=int, default=12)
    p.add_argument("--routing-streams", type=int, default=16, help="2-replica runs; 0: skip")
    p.add_argument("--no-routing", dest="routing_streams", action="store_const", const=0)
    p.add_argument("--gguf", default=None, help="default: the embedded Gemma 3 270M")
    p.add_argument("--hf-dir", default=str(compare.WORK / "gemma3-270m-bf16"))
    p.add_argument("--out", default=str(HERE / "out" / "prefix_cache"))
    args = p.parse_args()
    levels = [int(v) for v in args.levels.split(",")]
    args.workloads = args.workloads.split(",")
    args.gguf = args.gguf or compare.default_gguf()
    servers: dict[str, Any] = {}
    for name in args.servers.split(","):
        if name == "vllm" and not (compare.WORK / "vllm-venv" / "bin" / "python").exists():
            print("no vLLM venv (bench/peers/setup_vllm.sh): skipping vllm", file=sys.stderr)
            continue
        servers[name] = run_server(name, SERVERS[name][1], levels, args)
    routing: dict[str, Any] = {}
    if args.routing_streams:
        for policy in ("cache-aware", "least-load"):
            flags = ["--replicas", "2", "--routing", policy]
            routing[policy] = run_server(policy, flags, [args.routing_streams], args)
    result: dict[str, Any] = {
        "workloads": args.workloads, "levels": levels, "servers": servers, "routing": routing,
    }  # fmt: skip
    if "on" in servers and "off" in servers:
        result["on_vs_off"] = ratios(servers, "on", "off")
    if "on" in servers and "vllm" in servers:
        result["on_vs_vllm"] = ratios(servers, "on", "vllm")
    if len(routing) == 2:
        result["cache_aware_vs_least_load"] = ratios(routing, "cache-aware", "least-load")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefix_cache.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "prefix_cache.png")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
