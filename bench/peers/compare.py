"""Side-by-side: Headrace, vLLM (CPU) and llama.cpp's llama-server on the same model and load.

Starts every server on 127.0.0.1 with its own default settings and runs, at 1, 4, 16 and 32
concurrent streams, two closed-loop clients, each level on every server back to back
(`run_all`: the host's speed drift then moves all servers' figures of a level alike):

* `headrace.bench`: streaming, 64-token outputs with ignore_eos, varied prompts of plain words;
* vLLM's own `bench serve` (vllm_client.py, when the vLLM venv exists): random-token prompts of
  128-384 tokens, 32-96 output tokens, greedy.

Each runs once per sampling setting of `--sampling` (default both: `greedy`, temperature 0,
and `t0.8`, temperature 0.8; `t1.0p0.95` adds temperature 1 with top_p 0.95): a lead that
holds for greedy requests only is not a lead (clients send temperature 1 by default).

Every level (and the warm-up) draws fresh prompts (its own seed), so a server with a prefix
cache gets no free hits from an earlier level. Then it stops the servers, prints one JSON table
(output tokens/s, TTFT p50 and p95 per server, client and level, Headrace over the best peer)
and draws a PNG.

Set the peers up first (once): bench/peers/setup_vllm.sh and bench/peers/setup_llamacpp.sh.
vLLM needs a dense bf16 HF directory of the same weights: made here with `headrace export` when
--hf-dir does not exist yet.

  .venv/bin/python bench/peers/compare.py --out bench/out/compare
  .venv/bin/python bench/peers/compare.py --servers headrace,llamacpp --levels 1,4
  .venv/bin/python bench/peers/compare.py --sampling t0.8,t1.0p0.95 --levels 1,16,32,64
  # llama-server only where it is the nearest peer (one stream): its 64-stream levels take
  # minutes each
  .venv/bin/python bench/peers/compare.py --sampling greedy,t0.8,t1.0p0.95 \
      --levels 1,16,32,64 --peer-levels 'llamacpp=1'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import vllm_client  # beside this script
from peer_servers import Running, default_gguf, ensure_hf_dir, start_peer, stop

from headrace.bench import BenchError
from headrace.bench.client import Target
from headrace.bench.loadgen import Bounds, run_level
from headrace.bench.preflight import preflight
from headrace.bench.stats import Slo, summarize
from headrace.bench.workloads import Workload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = HERE / ".work"

SAMPLING = {"greedy": (0.0, 1.0), "t0.8": (0.8, 1.0), "t1.0p0.95": (1.0, 0.95)}


async def target_of(run: Running, sampling: str) -> Target:
    temperature, top_p = SAMPLING[sampling]
    target = Target(
        url=run.url, connection_per_request=run.peer.connection_per_request, timeout=600,
        temperature=temperature, top_p=top_p,
    )  # fmt: skip
    return await preflight(target)


async def warm_up(
    run: Running, workload: Workload, args: argparse.Namespace, sampling: str
) -> None:
    """Uncounted requests of the setting before its levels, prompts of their own."""
    if args.warmup:
        target = await target_of(run, sampling)
        warm = Bounds(num_requests=args.warmup, drain_timeout=120)
        warm_load = replace(workload, seed=workload.seed + 99_999)
        await run_level(
            target, warm_load, "concurrency", min(4, args.warmup), warm, scrape_interval=None
        )


async def measure(
    run: Running, workload: Workload, args: argparse.Namespace, sampling: str, level: int
) -> dict[str, Any]:
    """One level through headrace.bench's client, prompts of its own."""
    target = await target_of(run, sampling)
    bounds = Bounds(
        num_requests=max(args.min_requests, args.rounds * level),
        duration=args.max_seconds,
        drain_timeout=120,
    )
    fresh = replace(workload, seed=workload.seed + level)  # no prompt of an earlier level
    result = await run_level(target, fresh, "concurrency", level, bounds, scrape_interval=None)
    s = summarize(result.results, result.duration_s, Slo())
    return {
        "concurrency": level,
        "output_tokens_per_s": s["output_tokens_per_s"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p95_s": s["ttft_s"]["p95"],
        "tpot_p95_s": s["tpot_s"]["p95"],
        "completed": s["completed"],
        "failed": s["failed"],
        "errors": s["errors"]["by_type"],
    }


def run_level_everywhere(
    running: dict[str, Running],
    k: int,
    level: int,
    workload: Workload,
    args: argparse.Namespace,
    sampling: str,
) -> None:
    """Level `level` of setting `k` on every server that has it, one after another (the
    starting server rotates with the level), with each client."""
    suffix = "" if sampling == "greedy" else f"_{sampling}"
    names = [n for n in running if level in levels_of(n, args)]
    turn = args.levels.index(level) % len(names) if level in args.levels and names else 0
    for name in names[turn:] + names[:turn]:
        run = running[name]
        try:
            row = asyncio.run(measure(run, workload, args, sampling, level))
        except BenchError as exc:
            row = {"concurrency": level, "error": str(exc)}
        print(f"{name} @ {level} {sampling}: {row}", file=sys.stderr)
        run.rows.setdefault(f"levels{suffix}", []).append(row)
        if "vllm" in args.clients and vllm_client.available():
            temperature, top_p = SAMPLING[sampling]
            n = max(args.min_requests, args.rounds * level)
            seed = 1000 + level + 1_000_000 * k
            row = vllm_client.run_level(run.url, args.hf_dir, level, n, seed, temperature, top_p)
            print(f"{name} @ {level} {sampling} (vllm bench serve): {row}", file=sys.stderr)
            run.rows.setdefault(f"vllm_bench_serve{suffix}", []).append(row)


def run_all(
    names: list[str], workload: Workload, args: argparse.Namespace, out: Path
) -> dict[str, dict[str, Any]]:
    """Every server up at once (idle ones take ~2% of a core), then setting by setting, level
    by level, each level on every server back to back: a host whose speed drifts over the
    hour (by 15-25% on the 2-core VM this was built on) moves every server's figure of a
    level alike, where server after server it moved their ratios."""
    servers: dict[str, dict[str, Any]] = {}
    running: dict[str, Running] = {}
    for name in names:
        started = start_peer(name, args)
        if isinstance(started, Running):
            running[name] = started
            servers[name] = started.rows
        else:
            servers[name] = started
    try:
        for k, sampling in enumerate(args.sampling):
            # each setting its own prompts: the servers stay up, and a replay would be served
            # from their prefix caches (every peer has one)
            own = replace(workload, seed=workload.seed + 1_000_000 * k)
            for run in running.values():
                asyncio.run(warm_up(run, own, args, sampling))
            for level in sorted({lv for n in running for lv in levels_of(n, args)}):
                run_level_everywhere(running, k, level, own, args, sampling)
                # a run cut short keeps what it measured
                (out / "compare.partial.json").write_text(json.dumps(servers, indent=1))
    finally:
        for run in running.values():
            stop(run.proc)
    return servers


def levels_of(name: str, args: argparse.Namespace) -> list[int]:
    """The levels `name` is measured at: --peer-levels' own, else --levels."""
    levels: list[int] = args.peer_levels.get(name, args.levels)
    return levels


def peer_levels(spec: str) -> dict[str, list[int]]:
    """'llamacpp=1;vllm=1,16' -> {'llamacpp': [1], 'vllm': [1, 16]}."""
    out = {}
    for part in filter(None, spec.split(";")):
        name, _, levels = part.partition("=")
        out[name.strip()] = [int(v) for v in levels.split(",")]
    return out


def ratios(
    servers: dict[str, dict[str, Any]], levels: list[int], client: str = "levels"
) -> dict[str, Any]:
    """Headrace's output tokens/s over the best peer's, per level, for one client's rows."""

    def tps(name: str, level: int) -> float | None:
        rows = [r for r in servers.get(name, {}).get(client, []) if r["concurrency"] == level]
        return rows[0].get("output_tokens_per_s") if rows else None

    out: dict[str, Any] = {}
    for level in levels:
        ours = tps("headrace", level)
        peers = [v for n in servers if not n.startswith("headrace") and (v := tps(n, level))]
        if ours is not None and peers:
            out[str(level)] = ours / max(peers)
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, data in result["servers"].items():
        for key, rows in data.items():
            if not key.startswith("levels") or not rows:
                continue
            label = f"{name} {key.removeprefix('levels').lstrip('_') or 'greedy'}"
            x = [r["concurrency"] for r in rows]
            ax_t.plot(x, [r["output_tokens_per_s"] for r in rows], "o-", label=label)
            ax_l.plot(x, [r["ttft_p95_s"] or float("nan") for r in rows], "s--", label=label)
    for ax, title, unit in ((ax_t, "Output tokens/s", "tokens/s"), (ax_l, "TTFT p95", "s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["levels"], [str(v) for v in result["levels"]])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"Same model, same workload ({result['workload']['output_len'][0]}-token outputs)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def tokens_per_word(workload: Workload, hf_dir: Path, n: int = 200) -> float | None:
    """Gemma 3 tokens per word of the headrace client's prompts (every server here tokenizes
    with the same vocabulary), so that its tokens/s read in words too; None without the
    tokenizer file."""
    path = hf_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    prompts = [workload.request(i).prompt for i in range(n)]
    tokens = sum(len(tok.encode(p, add_special_tokens=False).ids) for p in prompts)
    return round(tokens / sum(len(p.split()) for p in prompts), 3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--servers", default="headrace,vllm,llamacpp")
    p.add_argument("--levels", default="1,4,16,32")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--prompt-len", default="32:256", help="words, LO:HI (varied prompts)")
    p.add_argument(
        "--peer-levels", default="", help="a server's own levels: 'llamacpp=1;vllm=1,16'"
    )
    p.add_argument("--rounds", type=int, default=3, help="requests per level = rounds x streams")
    p.add_argument("--min-requests", type=int, default=12)
    p.add_argument("--max-seconds", type=float, default=120.0, help="cap per level")
    p.add_argument("--warmup", type=int, default=4, help="uncounted requests before the levels")
    p.add_argument("--gguf", default=None, help="default: the embedded Gemma 3 270M")
    p.add_argument("--hf-dir", default=str(WORK / "gemma3-270m-bf16"), help="vLLM's model dir")
    p.add_argument("--headrace-args", default="", help="extra `headrace serve` flags")
    p.add_argument("--clients", default="headrace,vllm", help="headrace.bench and/or vllm's")
    p.add_argument("--sampling", default="greedy,t0.8", help=f"settings, of {', '.join(SAMPLING)}")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "compare"))
    args = p.parse_args()
    args.levels = [int(v) for v in args.levels.split(",")]
    args.peer_levels = peer_levels(args.peer_levels)
    args.sampling = [s for s in args.sampling.split(",") if s]
    if unknown := set(args.sampling) - set(SAMPLING):
        raise SystemExit(f"unknown --sampling {sorted(unknown)}: use {', '.join(SAMPLING)}")
    args.gguf = args.gguf or default_gguf()
    lo, _, hi = args.prompt_len.partition(":")
    workload = Workload(
        kind="uniform",
        prompt_len=(int(lo), int(hi or lo)),
        output_len=(args.output_len, args.output_len),
        seed=0,
    )
    if "vllm" in args.clients and vllm_client.available():
        ensure_hf_dir(Path(args.hf_dir), args.gguf)  # the tokenizer vLLM's client reads
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    servers = run_all(args.servers.split(","), workload, args, out)
    result = {
        "workload": workload.describe(),
        "prompt_tokens_per_word": tokens_per_word(workload, Path(args.hf_dir)),
        "levels": args.levels,
        "servers": servers,
        "sampling": {s: SAMPLING[s] for s in args.sampling},
    }
    for s in args.sampling:
        suffix = "" if s == "greedy" else f"_{s}"
        result[f"headrace_over_best_peer{suffix}"] = ratios(servers, args.levels, f"levels{suffix}")
        result[f"headrace_over_best_peer_vllm_client{suffix}"] = ratios(
            servers, args.levels, f"vllm_bench_serve{suffix}"
        )
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "compare.png")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
