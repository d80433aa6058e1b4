"""HTTP overhead: the server's end-to-end output tokens/s against the engine alone, same load.

For each concurrency level (closed loop: N clients, each sends its next request when the last
one ends), the same greedy requests (fixed prompts, `ignore_eos`, fixed max_tokens) run
(a) straight on an `AsyncEngine` in this process and (b) through a `headrace serve` process over
streaming /v1/completions, once per HTTP client (aiohttp, httpx), taking turns (A B C A B C) so
that the machine's noise hits all; each side's median turn counts. The client runs on the same
cores as the server, so its CPU a token (reported) is the engine's loss too: aiohttp's is about a
third of httpx's. While (b) runs, a prober times /health. Prints JSON.

    .venv/bin/python bench/http_overhead.py                       # Gemma 3 270M
    .venv/bin/python bench/http_overhead.py --model DIR --levels 1 8 32 --max-tokens 64
    .venv/bin/python bench/http_overhead.py --src-b /tmp/old/src   # before/after, same turns

With `--src-b` a second server runs another checkout's code beside this one's; its sides
(`server_<client>_b`) take their turns with the others, so a change is measured against the
code before it in the same run, on the same noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx

from headrace.bench import BenchError
from headrace.bench.local import free_port, wait_healthy
from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.request import SamplingParams

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
]


@dataclass
class Run:
    tokens: int = 0
    requests: int = 0
    seconds: float = 0.0
    health_ms: list[float] = field(default_factory=list)
    frontend_cpu_s: float = 0.0  # CPU of the process that holds the AsyncEngine front end
    client_cpu_s: float = 0.0  # the HTTP client's (this process, the /health prober included)

    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {
            "requests": self.requests,
            "output_tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(self.tokens_per_s(), 2),
            "frontend_cpu_us_per_token": round(self.frontend_cpu_s / max(self.tokens, 1) * 1e6, 1),
        }
        if self.client_cpu_s:  # on shared cores the client's CPU is the engine's loss too
            out["client_cpu_us_per_token"] = round(self.client_cpu_s / max(self.tokens, 1) * 1e6, 1)
        if self.health_ms:
            ms = sorted(self.health_ms)
            out["health_p50_ms"] = round(statistics.median(ms), 2)
            out["health_p99_ms"] = round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2)
            out["health_max_ms"] = round(ms[-1], 2)
            out["health_probes"] = len(ms)
        return out


def prompts(n: int, words: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words)) for i in range(n)]


async def closed_loop(
    concurrency: int, work: list[str], one: Callable[[int, str], Awaitable[int]]
) -> Run:
    """`concurrency` workers drain `work`; `one(i, prompt)` returns the tokens it produced."""
    run, queue = Run(), list(enumerate(work))

    async def worker() -> None:
        while queue:
            i, prompt = queue.pop()
            tokens = await one(i, prompt)  # not `+= await`: that reads the total before awaiting
            run.tokens += tokens
            run.requests += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    run.seconds = time.perf_counter() - t0
    return run


Runner = Callable[[int, list[str]], Awaitable[Run]]


def engine_runner(engine: AsyncEngine, max_tokens: int) -> Runner:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def one(i: int, prompt: str) -> int:
        tokens = 0
        ids = engine.tokenizer.encode(prompt)  # as the HTTP path does, in this process
        async for chunk in engine.generate(f"r{i}-{time.monotonic_ns()}", ids, params):
            tokens = chunk.completion_tokens
        return tokens

    async def run(n: int, work: list[str]) -> Run:
        cpu0 = time.process_time()  # this process: the engine's front end (the core is a child)
        result = await closed_loop(n, work, one)
        result.frontend_cpu_s = time.process_time() - cpu0
        return result

    return run


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def health_cpu_s(client: httpx.AsyncClient, pid: int, n: int = 200) -> float:
    """Server CPU seconds one /health costs (idle server), to keep the prober out of the
    per-token figure."""
    cpu0 = process_cpu_s(pid)
    for _ in range(n):
        (await client.get("/health")).raise_for_status()
    return (process_cpu_s(pid) - cpu0) / n


OneRequest = Callable[[int, str], Awaitable[int]]


def body(prompt: str, max_tokens: int) -> dict[str, object]:
    return {
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def usage_tokens(line: bytes | str) -> int | None:
    text = line.decode() if isinstance(line, bytes) else line
    if text.startswith("data: {") and '"usage":{' in text:
        return int(json.loads(text[6:])["usage"]["completion_tokens"])
    return None


def httpx_one(client: httpx.AsyncClient, max_tokens: int) -> OneRequest:
    async def one(i: int, prompt: str) -> int:
        tokens = 0
        async with client.stream("POST", "/v1/completions", json=body(prompt, max_tokens)) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                tokens = usage_tokens(line) or tokens
        return tokens

    return one


def aiohttp_one(session: aiohttp.ClientSession, max_tokens: int) -> OneRequest:
    async def one(i: int, prompt: str) -> int:
        tokens = 0
        async with session.post("/v1/completions", json=body(prompt, max_tokens)) as r:
            r.raise_for_status()
            async for line in r.content:
                tokens = usage_tokens(line) or tokens
        return tokens

    return one


def server_runner(client: httpx.AsyncClient, one: OneRequest, pid: int, probe_s: float) -> Runner:

    async def run(n: int, work: list[str]) -> Run:
        done = asyncio.Event()
        probe = asyncio.ensure_future(probe_health(str(client.base_url), done))
        cpu0 = process_cpu_s(pid)  # the server's front end: HTTP + its AsyncEngine
        client0 = time.process_time()
        result = await closed_loop(n, work, one)
        result.client_cpu_s = time.process_time() - client0
        cpu = process_cpu_s(pid) - cpu0
        done.set()
        result.health_ms = await probe
        result.frontend_cpu_s = max(cpu - len(result.health_ms) * probe_s, 0.0)
        return result

    return run


async def compare(
    args: argparse.Namespace, servers: dict[str, tuple[str, int]]
) -> dict[str, dict[str, object]]:
    """Engine and server take turns on each level (A B A B ...): the machine's noise hits both;
    each side's median run counts. `servers`: a side-name suffix -> (url, pid)."""
    engine = await AsyncEngine.start(*configs(args), served_model_name="bench")
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    clients, sessions = [], []
    try:
        sides = {"engine": engine_runner(engine, args.max_tokens)}
        probe_s = 0.0
        for suffix, (url, pid) in servers.items():
            client = httpx.AsyncClient(base_url=url, timeout=600, limits=limits)
            session = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=256))
            clients.append(client)
            sessions.append(session)
            probe_s = probe_s or await health_cpu_s(client, pid)
            ones = {"aiohttp": aiohttp_one(session, args.max_tokens),
                    "httpx": httpx_one(client, args.max_tokens)}  # fmt: skip
            for name in args.clients:
                sides[f"server_{name}{suffix}"] = server_runner(client, ones[name], pid, probe_s)
        for run in sides.values():
            await run(2, prompts(4, 8))  # warm-up
        print(f"/health costs the server {probe_s * 1e6:.0f} us of CPU", file=sys.stderr)
        out: dict[str, dict[str, object]] = {"health_cpu_us": {"value": round(probe_s * 1e6, 1)}}
        for n in args.levels:
            work = prompts(n * args.requests_per_stream, args.prompt_words)
            runs: dict[str, list[Run]] = {name: [] for name in sides}
            for _ in range(args.repeats):
                for name, run in sides.items():
                    runs[name].append(await run(n, work))
                    tps = runs[name][-1].tokens_per_s()
                    print(f"{n:>3} streams  {name:<14} {tps:8.1f} tokens/s", file=sys.stderr)
            out[str(n)] = level_summary(runs)
        return out
    finally:
        for session in sessions:
            await session.close()
        for client in clients:
            await client.aclose()
        await engine.close()


def level_summary(runs: dict[str, list[Run]]) -> dict[str, object]:
    """Each side's median run; per client, its tokens/s over the engine's and the server's CPU
    a token beyond what the engine's front end spends."""
    mid = {k: sorted(v, key=Run.tokens_per_s)[len(v) // 2] for k, v in runs.items()}
    engine = mid["engine"]
    out: dict[str, object] = {k: r.summary() for k, r in mid.items()}
    for name, r in mid.items():
        if name == "engine":
            continue
        client = name.removeprefix("server_")
        out[f"{client}_vs_engine"] = round(r.tokens_per_s() / engine.tokens_per_s(), 3)
        http_s = r.frontend_cpu_s / max(r.tokens, 1) - engine.frontend_cpu_s / max(engine.tokens, 1)
        out[f"{client}_http_cpu_us_per_token"] = round(http_s * 1e6, 1)
    out["all_tokens_per_s"] = {k: [round(r.tokens_per_s(), 1) for r in v] for k, v in runs.items()}
    return out


async def probe_health(url: str, done: asyncio.Event, every_s: float = 0.2) -> list[float]:
    """/health round trips (ms) on a connection of its own until `done`. Five a second, not
    twenty: a probe costs about 1.3 ms of httpx and 0.4 ms of the server, CPU the engine loses
    on shared cores (at 20 a second, a third of the server side's extra CPU)."""
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        while not done.is_set():
            t0 = time.perf_counter()
            r = await c.get("/health")
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
            await asyncio.sleep(every_s)
    return times


def start_server(
    args: argparse.Namespace, src: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`headrace serve` of this checkout, or of the one whose src/ is `src`."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "headrace.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    cmd += engine_flags(args)
    env = {**os.environ, "PYTHONPATH": src} if src else None
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except BenchError as exc:
        proc.kill()
        raise SystemExit(str(exc)) from None
    return proc, url


def engine_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--max-model-len", str(args.max_model_len), "--max-num-seqs", str(max(args.levels))]
    flags += ["--model", args.model] if args.model else []
    flags += ["--dtype", args.dtype]
    return flags


def configs(args: argparse.Namespace) -> tuple[ModelConfig, CacheConfig, SchedulerConfig]:
    model = ModelConfig(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len)
    return model, CacheConfig(), SchedulerConfig(max_num_seqs=max(args.levels))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF or HF dir (default: Gemma 3 270M)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=32)
    p.add_argument("--requests-per-stream", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="turns per side and level")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument(
        "--clients", choices=["aiohttp", "httpx"], nargs="+", default=["aiohttp", "httpx"],
        help="the load's HTTP clients, a side each (they share the server's cores)",
    )  # fmt: skip
    p.add_argument("--src-b", default=None, help="src/ of a second checkout to serve beside")
    args = p.parse_args()
    procs = {"": start_server(args)}
    if args.src_b:
        procs["_b"] = start_server(args, args.src_b)
    try:
        servers = {suffix: (url, proc.pid) for suffix, (proc, url) in procs.items()}
        levels = asyncio.run(compare(args, servers))
    finally:
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    result = {
        "model": args.model or "gemma-3-270m (embedded)",
        "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words,
        "clients": args.clients,
        "src_b": args.src_b,
        "cpus": os.cpu_count(),
        "levels": levels,
        "targets": {"server_vs_engine_at_32": 0.9, "health_p99_ms": 50},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
