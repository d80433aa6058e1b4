"""What the router costs in front of one local replica: µs a request and µs a chunk.

Headrace always puts a `Router` in front of a model's replicas, even a single one (its
supervisor restarts a crashed or hung replica and resumes the streams it served). This times
that hop alone: a stand-in engine client (`HopEngine`, no model, no core process) streams K
chunks per request, the last with finish reason `length`, and the same requests are read

- `direct`: from the engine's `generate(...)` itself;
- `router`: from `Router.generate(...)` over one `Replica` of that engine, built as
  `router/deploy.py` builds a local replica (`Replica(name, engine, pool="main",
  starter=...)`, `Router(model, [replica], RouterConfig())`, `router.start()`; its supervisor
  runs throughout).

For K = 1 (the per-request cost: routing, the attempt, the resumable stream) and K = `--chunks`
(64: the per-chunk cost of the generators the chunks pass through), at concurrency 1 and 32
(32 requests at a time via asyncio.gather), in two engine modes:

- `suspend` (the realistic one): the engine awaits `asyncio.sleep(0)` before each chunk. The
  real `AsyncEngine.generate` awaits its request's queue, which is empty between two steps
  (tens of ms apart), so every chunk suspends the task and wakes it again, and that suspension
  and wake-up pass through every generator frame the router stacks on top (router, attempts,
  attempt, engine): part of the router's real per-chunk cost only shows in this mode.
- `eager`: the chunks follow one another without yielding to the event loop (a lower bound).

Each turn runs a batch of requests on one side and then on the other; the sides alternate
which goes first, and every configuration takes its turn in each round, so that the machine's
noise hits all. Medians over the turns: µs per request, µs per chunk, the router's extra µs
(router - direct) and the ratio router / direct; `router_us_per_extra_chunk` is the router's
extra cost of one more chunk in a stream, ((extra a request at K) - (extra at K=1)) / (K - 1).
The direct side is only a fake engine's cost: the ratio says how thin the hop is next to
nothing, the extra µs what it adds to a real stream (compare with a decode step's ms).
Prints JSON and writes it to `--out` (bench/out/router_hop.json).

    .venv/bin/python bench/router_hop.py
    .venv/bin/python bench/router_hop.py --rounds 21 --chunks 128 --mode suspend
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from headrace.config import RouterConfig
from headrace.engine.frontend.client import EngineClient, GenerateOptions, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams
from headrace.router.replica import Replica
from headrace.router.router import Router

OUT = Path(__file__).resolve().parent / "out"
STATS_EVERY_S = 0.5  # an idle core pushes its stats this often (the supervisor's stall check)
PROMPT = list(range(100, 132))  # 32 prompt tokens


class NoTokenizer:
    """The router keeps a replica's tokenizer for resumes only; none happens here."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        raise NotImplementedError

    def renders_tools(self) -> bool:
        return False

    @property
    def vocab_size(self) -> int:
        return 1000

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return ()


class HopEngine:
    """A stand-in `EngineClient`: `max_tokens` one-token chunks a request, no model behind.

    `suspend`: await `asyncio.sleep(0)` before each chunk, as the real client awaits its
    request's queue. Its stats are a new object every `STATS_EVERY_S` (a background task, as
    the real client's output loop keeps them), so that the supervisor sees a live replica.
    """

    model_name = "hop"
    max_model_len = 4096
    pid: int | None = None
    is_healthy = True
    failure: str | None = None

    def __init__(self, suspend: bool) -> None:
        self.suspend = suspend
        self.tokenizer: Tokenizer = NoTokenizer()
        self._stats = StepStats(kv_blocks_total=1024)
        self._reports = 0
        self._ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            self._reports += 1
            self._stats = StepStats(kv_blocks_total=1024, num_tokens_total=self._reports)

    def stats(self) -> StepStats:
        return self._stats

    def describe(self) -> dict[str, object]:
        return {}

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        n, prompt, suspend = params.max_tokens, len(prompt_token_ids), self.suspend
        for i in range(1, n + 1):
            if suspend:
                await asyncio.sleep(0)
            reason = FinishReason.LENGTH if i == n else None
            yield GenerationChunk(request_id, "x", [i], reason, prompt, i)

    async def abort(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()


Generate = Callable[[str, list[int], SamplingParams], AsyncIterator[GenerationChunk]]


async def drain(chunks: AsyncIterator[GenerationChunk], k: int) -> None:
    n, last = 0, None
    async for chunk in chunks:
        n, last = n + 1, chunk
    if n != k or last is None or last.finish_reason is not FinishReason.LENGTH:
        raise AssertionError(f"expected {k} chunks ending in length, got {n} ({last})")


async def turn(generate: Generate, tag: str, k: int, concurrency: int, requests: int) -> float:
    """Seconds to stream `requests` requests of `k` chunks, `concurrency` at a time."""
    params = SamplingParams(max_tokens=k, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    if concurrency == 1:
        for i in range(requests):
            await drain(generate(f"{tag}-{i}", PROMPT, params), k)
    else:
        for start in range(0, requests, concurrency):
            await asyncio.gather(
                *(drain(generate(f"{tag}-{start + j}", PROMPT, params), k)
                  for j in range(concurrency))
            )  # fmt: skip
    return time.perf_counter() - t0


def summarize(direct: list[float], router: list[float], requests: int, k: int) -> dict[str, Any]:
    def us(seconds: list[float], per: int) -> float:
        return statistics.median(seconds) / per * 1e6

    a_req, b_req = us(direct, requests), us(router, requests)
    return {
        "requests_per_turn": requests,
        "turns": len(direct),
        "direct_us_per_request": round(a_req, 2),
        "router_us_per_request": round(b_req, 2),
        "router_extra_us_per_request": round(b_req - a_req, 2),
        "direct_us_per_chunk": round(a_req / k, 3),
        "router_us_per_chunk": round(b_req / k, 3),
        "router_extra_us_per_chunk": round((b_req - a_req) / k, 3),
        "ratio_router_over_direct": round(b_req / a_req, 2),
        # spread of the router's side between turns, to judge the noise
        "router_us_per_request_min_max": [round(us([min(router)], requests), 2),
                                          round(us([max(router)], requests), 2)],
    }  # fmt: skip


async def run_mode(
    suspend: bool, ks: list[int], levels: list[int], rounds: int, chunks_per_turn: int
) -> dict[str, Any]:
    engine = HopEngine(suspend)
    engine.start()

    async def restart() -> EngineClient:  # the supervisor's, never needed here
        fresh = HopEngine(suspend)
        fresh.start()
        return fresh

    replica = Replica("hop-0", engine, pool="main", starter=restart)
    router = Router(engine.model_name, [replica], RouterConfig())
    router.start()
    sides: dict[str, Generate] = {"direct": engine.generate, "router": router.generate}
    configs = [(k, c) for k in ks for c in levels]
    times: dict[tuple[int, int], dict[str, list[float]]] = {
        cfg: {"direct": [], "router": []} for cfg in configs
    }

    def requests_for(k: int, c: int) -> int:
        n = max(chunks_per_turn // k, c)
        return -(-n // c) * c  # whole gathers

    try:
        for r in range(rounds + 1):  # round 0 warms up and is dropped
            for k, c in configs:
                order = ["direct", "router"] if r % 2 else ["router", "direct"]
                for side in order:
                    seconds = await turn(sides[side], f"{side}{r}", k, c, requests_for(k, c))
                    if r:
                        times[k, c][side].append(seconds)
    finally:
        await router.close()
    assert replica.restarts == 0 and router.retries == 0 and router.resumes == 0
    result: dict[str, Any] = {}
    for k, c in configs:
        t = times[k, c]
        result[f"k{k}_c{c}"] = summarize(t["direct"], t["router"], requests_for(k, c), k)
    for c in levels:  # the cost of one more chunk through the router
        if len(ks) > 1:
            k = max(ks)
            one, many = result.get(f"k1_c{c}"), result[f"k{k}_c{c}"]
            if one is not None:
                extra = many["router_extra_us_per_request"] - one["router_extra_us_per_request"]
                many["router_us_per_extra_chunk"] = round(extra / (k - 1), 3)
    return result


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=64, help="K of the long streams (besides 1)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 32], help="concurrency levels")
    p.add_argument("--mode", choices=["suspend", "eager", "both"], default="both")
    p.add_argument("--rounds", type=int, default=21, help="turns per side and configuration")
    p.add_argument("--chunks-per-turn", type=int, default=4096,
                   help="chunks a turn streams (K=1: this many requests)")  # fmt: skip
    p.add_argument("--out", default=str(OUT / "router_hop.json"))
    args = p.parse_args()
    ks = [1, args.chunks] if args.chunks > 1 else [1]
    modes = ["suspend", "eager"] if args.mode == "both" else [args.mode]
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "prompt_tokens": len(PROMPT),
        "routing": RouterConfig().routing,
    }
    for mode in modes:
        suspend = mode == "suspend"
        result[mode] = asyncio.run(
            run_mode(suspend, ks, args.levels, args.rounds, args.chunks_per_turn)
        )
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=2)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
