"""Host time of a decode step's inputs (`build_step_inputs`), the part of a step that runs in
series with the device on a GPU (#33). Prints JSON: median microseconds per call.

Gemma 3 270M's layout (windows 512 and full, KV blocks of 16 tokens), `rows` decodes at
`context` tokens each, in-place decode attention (the CUDA and CPU default). The device here
is the CPU, where the tensors are the host buffers themselves; on CUDA each step adds its
host-to-device copies (one, pinned, since staging.py).

    .venv/bin/python bench/step_inputs_host.py --rows 1,64,256 --context 512
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.request import SamplingParams

BLOCK = 16
WINDOWS = (512, None)


def decodes(rows: int, context: int) -> list[ScheduledRequest]:
    blocks = -(-(context + 1) // BLOCK)
    return [
        ScheduledRequest(
            request_id=str(r),
            token_ids=[r + 1],
            start_pos=context - r % 7,  # contexts a little apart, as in a real batch
            block_ids=list(range(r * blocks, (r + 1) * blocks)),
            sample=True,
            params=SamplingParams(max_tokens=16),
            num_output_tokens=3,
        )
        for r in range(rows)
    ]


def time_us(rows: int, context: int, repeats: int) -> float:
    step = decodes(rows, context)
    cpu = torch.device("cpu")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_step_inputs(step, BLOCK, WINDOWS, cpu, torch.bfloat16, paged_kernel=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1,16,64,256")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    report = {f"rows{r}_us": time_us(r, args.context, args.repeats) for r in rows}
    print(json.dumps({"context": args.context, **report}, indent=1))


if __name__ == "__main__":
    main()
