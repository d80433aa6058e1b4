"""The host's share of a decode step, without a model: what a GPU step runs in series with the
device while nothing overlaps them (#33's "host hidden" goal). Prints JSON.

An `EngineCore` (scheduler, KV manager, update) on a runner that does the real runner's host
work for a step (`check_step`, and `build_step_inputs` over its kept block rows for Gemma 3
270M's layout: windows 512 and full, 16-token blocks, in-place decode attention; not the
grammar and LoRA bookkeeping, a pass that finds nothing to do for plain requests, nor the
graph buffers' few fixed copies) and then, instead of a forward, returns a
fixed token for every sampled row. `streams` requests of `prompt` tokens decode `output`
tokens each (`ignore_eos`); only decode-only steps are timed. Median microseconds a step:
schedule, inputs (the runner's host part) and update, and the whole step.

Set beside a device step: Gemma 3 270M's bandwidth floor is ~0.13 ms plus its KV reads
(docs/performance.md, #33); a step's host time above that is the device idling unless the
next step's host work overlaps this one's device work.

    .venv/bin/python bench/host_step.py --streams 1,64,256
    .venv/bin/python bench/host_step.py --streams 1,64,256 --async-scheduling

With `--async-scheduling` the same work is done in the overlapped order (the scheduler's
placeholders, the runner's search for them, the step landing a step later): on a GPU it runs
while the device computes the step before, so what matters is that it is no larger.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_profile import SPENT, timed  # noqa: E402  (beside this script: the same wrappers)

from headrace.config import SchedulerConfig  # noqa: E402
from headrace.engine.core.engine_core import EngineCore  # noqa: E402
from headrace.engine.messages import EngineCoreRequest  # noqa: E402
from headrace.engine.outputs import RunnerOutput, SchedulerOutput  # noqa: E402
from headrace.engine.runner.block_rows import BlockRows  # noqa: E402
from headrace.engine.runner.step_checks import check_step  # noqa: E402
from headrace.engine.runner.step_inputs import build_step_inputs  # noqa: E402
from headrace.request import SamplingParams  # noqa: E402

BLOCK = 16
WINDOWS = (512, None)


class HostOnlyRunner:
    """The runner's host work for a step, and a fixed token in place of the model's."""

    block_size = BLOCK
    eos_token_ids = (1,)
    model_name = "host-only"

    def __init__(self, num_kv_blocks: int, max_model_len: int) -> None:
        self.num_kv_blocks, self.max_model_len = num_kv_blocks, max_model_len
        self.vocab_size = 1000
        self.block_rows = BlockRows(num_kv_blocks)

    def describe(self) -> dict[str, str | int]:
        return {"model": self.model_name, "device": "cpu"}

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self.launch(out)

    def finish(self, launched: RunnerOutput) -> RunnerOutput:
        return launched

    def launch(self, out: SchedulerOutput, keep: bool = False) -> RunnerOutput:
        """The host's part of a launch (--async-scheduling: placeholders allowed, found)."""
        start = time.perf_counter()
        limits = (self.max_model_len, self.vocab_size, self.num_kv_blocks, BLOCK)
        check_step(out, *limits, True, pending_ok=True)
        self.block_rows.drop(out.finished_ids)
        inputs = build_step_inputs(
            out.scheduled, BLOCK, WINDOWS, torch.device("cpu"), torch.bfloat16, paged_kernel=True,
            block_rows=self.block_rows,
        )  # fmt: skip
        SPENT["inputs"] += time.perf_counter() - start
        return RunnerOutput(sampled={s.request_id: 7 for s in inputs.sampled})


def measure(streams: int, prompt: int, output: int, overlap: bool = False) -> dict[str, float]:
    blocks = streams * (-(-(prompt + output) // BLOCK) + 1) + 16
    runner = HostOnlyRunner(blocks, prompt + output + BLOCK)
    config = SchedulerConfig(  # no speculation: a draft would make a step more than a decode
        max_num_seqs=streams, max_num_batched_tokens=max(2048, streams), num_speculative_tokens=0,
        async_scheduling=overlap,
    )  # fmt: skip
    core = EngineCore(config, runner)
    core.scheduler.schedule = timed("schedule", core.scheduler.schedule)  # type: ignore[method-assign]
    core.scheduler.update = timed("update", core.scheduler.update)  # type: ignore[method-assign]
    if core.overlap is not None:  # the placeholders: counted with the update
        core.scheduler.assume = timed("update", core.scheduler.assume)  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0.0)
    for i in range(streams):
        ids = [2 + (i + j) % 900 for j in range(prompt)]
        core.add_request(EngineCoreRequest(str(i), ids, params))
    rows: list[dict[str, float]] = []
    while core.has_work():
        SPENT.clear()
        start = time.perf_counter()
        core.step()
        total = time.perf_counter() - start
        if core.last_stats.num_prefill_tokens == 0 and core.last_stats.num_running == streams:
            rows.append({**SPENT, "step": total})
    keys = ("schedule", "inputs", "update", "step")
    return {f"{k}_us": round(statistics.median(r[k] for r in rows) * 1e6, 1) for k in keys} | {
        "steps": len(rows)
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", default="1,16,64,256")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--async-scheduling", action="store_true", help="the overlapped path's work")
    args = p.parse_args()
    report: dict[str, Any] = {"prompt": args.prompt, "output": args.output}
    report["async_scheduling"] = args.async_scheduling
    for s in (int(x) for x in args.streams.split(",")):
        report[f"streams{s}"] = measure(s, args.prompt, args.output, args.async_scheduling)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
