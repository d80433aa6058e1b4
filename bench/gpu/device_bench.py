"""The GPU check of issue #33 in one run: where a decode step stands against the device's
bandwidth floor, for the embedded model's shape (Gemma 3 270M) and a Llama-3-8B shape, both with
random bf16 weights built on the device. Prints and writes JSON.

    python bench/gpu/device_bench.py --out $OUT/h200.json     # on the GPU: bench/gpu/run.sh
    .venv/bin/python bench/gpu/device_bench.py --device cpu --quick  # tiny, on the CPU here

For each shape and batch size (1 ... 256 streams of ~`--context` tokens):
  * `step_ms`: one decode step of the runner as the engine calls it (inputs built, model,
    head, greedy pick), synchronized, median of `--steps`; tokens/s = batch / step;
  * `floor_ms`: (weight bytes + KV bytes the step must read) / `--bandwidth` (4.3 TB/s: the
    H200's measured ceiling in the device notes); `over_floor` = step / floor;
  * `profile`, at the smallest and the largest batch (torch.profiler): `busy`, summed device
    kernel time over the step's wall time (how much of a step the host leaves the device
    idle), kernel launches a step, and the five kernels that take the most device time.
The default path on CUDA is in-place decode attention (a Triton kernel) with decode steps
replayed as CUDA graphs; the same shapes run again at a few batches without graphs (keys
`*_eager`), with each layer's small ops compiled (`*_compiled`: --torch-compile; `ready_s`
says what the compiles cost at start), and with attention over gathered copies of the blocks
and no graphs (`*_gathered`,
`HEADRACE_TRITON_DECODE=0`, `HEADRACE_TRITON_PREFILL=0`): the eager path before both,
measured in the same run. Each shape also times `chunk_ms`: a prefill step of 512 tokens over
1,536 cached ones (a chunked prompt's fourth chunk), read in place or gathered as the mode has it.
Then the engine as served (continuous batching, scheduler and all, no HTTP) on the small shape:
output tokens/s and TPOT with 1 / 16 / 64 / 256 requests of 64 tokens at once, and the join
probe: a short request added beside 64 running streams, its wait to a first token against its
own prefill alone; then `sampled`: the middle level again at T 0.8, top_p 0.95, with the host's
waits for the device a step (`host_waits_per_step`: torch's sync debug mode). In series
(`engine_gemma3-270m`) and with --async-scheduling (`engine_gemma3-270m_async`: each step
launched before the last one's tokens are read). And `top_p`: a sampled draw's top_p set
found the two ways (sampler_probe.py), at 1 / 16 / 64 / 256 rows of Gemma 3's vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from engine_probe import engine_rates  # noqa: E402  (beside this script)
from random_model import kv_bytes_per_token, random_runner, weight_bytes  # noqa: E402
from sampler_probe import top_p_times  # noqa: E402

from headrace.engine.runner.runner_harness import RunnerHarness  # noqa: E402
from headrace.layers import compiled  # noqa: E402
from headrace.request import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and batches (CPU check)")
    ap.add_argument("--context", type=int, default=384)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--bandwidth", type=float, default=4.3e12, help="bytes/s of device memory")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    device = torch.device(args.device)
    # (shape, batches, mode): "graphs" is the default path on CUDA (in-place decode attention,
    # CUDA graphs); "eager" the same without graphs; "gathered" the eager path before both
    plans = [
        ("gemma3-270m", [1, 2, 4, 8, 16, 32, 64, 128, 256], "graphs"),
        ("gemma3-270m", [1, 64, 256], "eager"),
        ("gemma3-270m", [1, 64, 256], "gathered"),
        ("llama3-8b", [1, 8, 64], "graphs"),
        ("llama3-8b", [1, 64], "gathered"),
        ("gemma3-270m", [1, 64, 256], "compiled"),  # last: its compiles take the longest
    ]
    if args.quick:
        plans = [("gemma3-270m", [1, 4], "graphs"), ("gemma3-270m", [4], "gathered")]
        plans.append(("gemma3-270m", [1], "compiled"))
        plans.append(("llama3-8b", [1, 2], "graphs"))
        args.context, args.steps = 48, 2
    report: dict[str, Any] = {"device": _device_name(device), "torch": torch.__version__}
    report["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    streams = [1, 4] if args.quick else [1, 16, 64, 256]
    parts = [
        (
            name + ("" if mode == "graphs" else f"_{mode}"),
            partial(_shape, name, b, device, args, mode),
        )
        for name, b, mode in plans
    ]
    engines = [  # right after the graph steps: a run cut short still has both
        ("engine_gemma3-270m", lambda: engine_rates("gemma3-270m", device, streams, args.quick)),
        (
            "engine_gemma3-270m_async",
            lambda: engine_rates("gemma3-270m", device, streams, args.quick, overlap=True),
        ),
    ]
    parts[1:1] = engines
    parts.insert(3, ("top_p", lambda: top_p_times(device, args.quick)))
    for key, part in parts:
        try:  # a part that breaks on a new machine must not cost the others' figures
            report[key] = part()
        except Exception as e:  # noqa: BLE001
            report[key] = {"error": repr(e)}
        finally:
            compiled.enable(False)  # a compiled part's setting ends with it
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _write(report, args.out)  # after each part: a run cut short keeps what it measured
    print(json.dumps(report, indent=1))


def _write(report: dict[str, Any], out: str) -> None:
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


def _shape(
    name: str, batches: list[int], device: torch.device, args: Any, mode: str
) -> dict[str, Any]:
    """`mode`: "graphs" (the runner's default: on CUDA in-place decode attention through the
    Triton kernel and CUDA graphs), "compiled" (the same with --torch-compile: each layer's
    small ops fused), "eager" (no graphs) or "gathered" (decode attention over gathered copies
    of the blocks, no graphs: the eager baseline)."""
    tokens = max(batches) * (args.context + args.steps + 2)
    flags = ("HEADRACE_TRITON_DECODE", "HEADRACE_TRITON_PREFILL")
    for flag in flags:
        os.environ[flag] = "0" if mode == "gathered" else "1"
    compiled.enable(mode == "compiled")  # before the graphs' warm-up, which compiles
    try:  # read once, when the runner picks its attention path
        graphs = None if mode in ("graphs", "compiled") else False
        start = time.perf_counter()
        runner = random_runner(name, device, tokens, quick=args.quick, graphs=graphs)
        ready_s = time.perf_counter() - start
    finally:
        for flag in flags:
            del os.environ[flag]
    wbytes = weight_bytes(runner.model)
    out: dict[str, Any] = {
        "weight_bytes": wbytes,
        "decode_attention": "in place" if runner.paged_kernel else "gathered",
        "prefill_attention": "in place" if runner.paged_prefill else "gathered",
        "graphs": bool(runner.decode_graphs and runner.decode_graphs.captured),
        "compiled": compiled.takes(torch.zeros(1, device=device)),
        "ready_s": round(ready_s, 1),  # weights made, graphs captured (compiles included)
        "chunk_ms": _chunk_ms(runner, 48 if args.quick else 1536, 16 if args.quick else 512),
        "levels": {},
    }
    for b in batches:
        harness, ms = _decode_ms(runner, b, args.context, args.steps, device)
        kv = sum(kv_bytes_per_token(runner.model.args, args.context) for _ in range(b))
        floor = 1000 * (wbytes + kv) / args.bandwidth
        row = {
            "step_ms": round(ms, 3),
            "tokens_per_s": round(1000 * b / ms, 1),
            "floor_ms": float(f"{floor:.4g}"),
            "over_floor": round(ms / floor, 2),
        }
        if b in (batches[0], batches[-1]) and (device.type == "cuda" or args.quick):
            try:
                row["profile"] = _busy_share(harness, device)
            except Exception as e:  # noqa: BLE001  (the profiler's API moves between versions)
                row["profile"] = repr(e)
        out["levels"][str(b)] = row
        print(name, b, row, flush=True)
    del runner
    return out


def _decode_ms(
    runner: Any, batch: int, context: int, steps: int, device: torch.device
) -> tuple[RunnerHarness, float]:
    """Median ms of a decode step of `batch` sequences once their prompts are in."""
    harness = RunnerHarness(runner)
    gen = torch.Generator().manual_seed(batch)
    vocab = runner.vocab_size
    for i in range(batch):
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        harness.add(f"s{i}", prompt, max_new=1 << 20, params=GREEDY, chunk=2048)
    while any(s.num_computed < len(s.prompt) for s in harness.seqs.values()):
        harness.step()
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        harness.step()
        _sync(device)
        times.append(1000 * (time.perf_counter() - start))
    return harness, statistics.median(times)


def _chunk_ms(runner: Any, context: int, chunk: int, repeats: int = 5) -> float:
    """Median ms of a prefill step of `chunk` tokens after `context` cached ones."""
    harness = RunnerHarness(runner)
    gen = torch.Generator().manual_seed(context)
    times = []
    for r in range(repeats):
        prompt = torch.randint(0, runner.vocab_size, (context + chunk,), generator=gen).tolist()
        harness.add(f"c{r}", prompt, max_new=1, params=GREEDY, chunk=chunk)
        while harness.seqs[f"c{r}"].num_computed < context:
            harness.step()
        _sync(runner.device)
        start = time.perf_counter()
        harness.step()
        _sync(runner.device)
        times.append(1000 * (time.perf_counter() - start))
        harness.release(f"c{r}")
    return round(statistics.median(times), 3)


def _busy_share(harness: RunnerHarness, device: torch.device) -> dict[str, Any]:
    """Over three decode steps: device kernel time over wall time, kernel launches a step,
    and the five kernels that take the most device time (where the time goes)."""
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(3):
            harness.step()
        _sync(device)
        wall = time.perf_counter() - start
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    busy = sum(e.device_time_total for e in kernels) / 1e6
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:5]
    return {
        "busy": round(busy / wall, 3),
        "launches_per_step": round(sum(e.count for e in kernels) / 3),
        "top_kernels_ms_per_step": {e.key[:60]: round(e.device_time_total / 3e3, 3) for e in top},
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    main()
