"""The engine core alone in a closed loop, on the load of vLLM's `bench serve` client
(compare.py): random-token prompts of 128-384 tokens, 32-96 output tokens (`ignore_eos`),
`--streams` requests open at once, a new one as each ends, `--requests` in all. No HTTP, no
client, no second process: what the engine does on its own, to set beside a served run. The
KV pool is touched before the loop, as in a server that has run a while.

Prints JSON: output tokens/s over the loop's wall time, and per kind of step (prefill only,
decode only, mixed) the steps, their seconds, prompt tokens and decode rows; with `--profile`,
the seconds of each category of `step_profile.py` per kind (wrappers timed around the call
sites, so a little slower than without).

    .venv/bin/python bench/engine_loop.py --streams 32 --requests 96
    .venv/bin/python bench/engine_loop.py --streams 32 --requests 96 --temperature 0.8 --profile
    .venv/bin/python bench/engine_loop.py --streams 64 --requests 192 --temperature 1.0 --top-p 0.95
    .venv/bin/python bench/engine_loop.py --streams 32 --requests 96 --async-scheduling
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_profile  # noqa: E402  (beside this script: the category wrappers)

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig  # noqa: E402
from headrace.engine.core.engine_core import EngineCore  # noqa: E402
from headrace.engine.messages import EngineCoreRequest, StepStats  # noqa: E402
from headrace.engine.runner.model_runner import ModelRunner  # noqa: E402
from headrace.request import SamplingParams  # noqa: E402


def make_request(
    i: int, rng: random.Random, vocab: int, temperature: float, top_p: float = 1.0
) -> EngineCoreRequest:
    ids = [rng.randrange(1000, vocab - 1000) for _ in range(rng.randint(128, 384))]
    params = SamplingParams(
        temperature=temperature, top_p=top_p, max_tokens=rng.randint(32, 96), ignore_eos=True
    )
    return EngineCoreRequest(f"r{i}", ids, params)


def kind(stats: StepStats) -> str:
    if stats.num_prefill_tokens == 0:
        return "decode"
    return "prefill" if stats.num_decode_tokens == 0 else "mixed"


@dataclass
class Kind:
    """The steps of one kind, summed."""

    steps: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    decode_rows: int = 0
    spent: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # --profile

    def add(self, stats: StepStats) -> None:
        self.steps += 1
        self.seconds += stats.step_duration
        self.prompt_tokens += stats.num_prefill_tokens
        self.decode_rows += stats.num_decode_tokens
        for name, seconds in step_profile.SPENT.items():
            self.spent[name] += seconds

    def report(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "s": round(self.seconds, 2),
            "prompt_tokens": self.prompt_tokens,
            "decode_rows": self.decode_rows,
            "ms_a_step": round(self.seconds / self.steps * 1e3, 1),
        }


def warmed_core(
    rng: random.Random, temperature: float, top_p: float, overlap: bool = False
) -> tuple[EngineCore, int]:
    """The core, its KV pool touched and four requests drawn from `rng` run; and the model's
    vocabulary. `overlap`: --async-scheduling."""
    sched = SchedulerConfig(async_scheduling=overlap)
    core = EngineCore.from_configs(ModelConfig(), CacheConfig(), sched)
    assert isinstance(core.runner, ModelRunner)
    # A fresh pool's pages are faulted in by the first step to write them (1.3 s a GiB here,
    # kv_cache.py); a server that has run a while has paid that, so the loop does it first.
    for pair in core.runner.kv_cache.layers:
        for pool in pair:
            pool.zero_()
    for i in range(4):
        core.add_request(make_request(-1 - i, rng, core.runner.vocab_size, temperature, top_p))
    while core.has_work():
        core.step()
    return core, core.runner.vocab_size


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    core, vocab = warmed_core(rng, args.temperature, args.top_p, args.async_scheduling)
    if args.profile:
        step_profile.instrument()
    sent = out_tokens = 0

    def send() -> None:
        nonlocal sent
        core.add_request(make_request(sent, rng, vocab, args.temperature, args.top_p))
        sent += 1

    for _ in range(args.streams):
        send()
    kinds: dict[str, Kind] = defaultdict(Kind)
    start = time.perf_counter()
    while core.has_work():
        step_profile.SPENT.clear()
        outputs, stats = core.step()
        kinds[kind(stats)].add(stats)
        for o in outputs:
            out_tokens += len(o.new_token_ids)
            if o.finish_reason is not None and sent < args.requests:
                send()
    wall = time.perf_counter() - start
    report: dict[str, Any] = {
        "streams": args.streams,
        "requests": args.requests,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "async_scheduling": args.async_scheduling,
        "steps_overlapped": core.last_stats.steps_overlapped_total,
        "wall_s": round(wall, 2),
        "output_tokens": out_tokens,
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "by_kind": {k: row.report() for k, row in kinds.items()},
    }
    if args.profile:
        report["profile_s"] = {
            k: {n: round(v, 2) for n, v in row.spent.items()} for k, row in kinds.items()
        }
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1016)
    p.add_argument("--profile", action="store_true", help="seconds per category and kind")
    p.add_argument("--async-scheduling", action="store_true", help="steps overlap (engine.md)")
    print(json.dumps(run(p.parse_args()), indent=1))


if __name__ == "__main__":
    main()
