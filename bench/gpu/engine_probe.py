"""The engine core as served, without HTTP (the GPU machine lacks the web stack's wheels unless
they travel): output tokens/s and TPOT for N requests at once, and the join probe."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from random_model import random_runner

from headrace.config import SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.messages import EngineCoreRequest
from headrace.request import SamplingParams

PROMPT, OUTPUT = 256, 64


def engine_rates(
    name: str, device: torch.device, streams: list[int], quick: bool, overlap: bool = False
) -> dict[str, Any]:
    """`overlap`: --async-scheduling (the next step launched before this one's tokens are
    read), against the steps in series."""
    prompt, output = (32, 8) if quick else (PROMPT, OUTPUT)
    top = max(max(streams), 65)
    runner = random_runner(name, device, top * (prompt + output + 16), quick)
    sched = SchedulerConfig(max_num_seqs=top, num_speculative_tokens=0, async_scheduling=overlap)
    core = EngineCore(sched, runner, enable_prefix_caching=False)
    gen = torch.Generator().manual_seed(1)
    vocab = runner.vocab_size

    def request(rid: str, n_prompt: int, n_out: int, sampled: bool = False) -> EngineCoreRequest:
        ids = torch.randint(0, vocab, (n_prompt,), generator=gen).tolist()
        temperature, top_p = (0.8, 0.95) if sampled else (0.0, 1.0)
        params = SamplingParams(
            temperature=temperature, top_p=top_p, max_tokens=n_out, ignore_eos=True
        )
        return EngineCoreRequest(rid, ids, params)

    out: dict[str, Any] = {"prompt_tokens": prompt, "output_tokens": output, "levels": {}}
    out["async_scheduling"] = overlap
    _run(core, [request("warm", prompt, 4)], device)
    for n in streams:
        reqs = [request(f"n{n}-{i}", prompt, output) for i in range(n)]
        wall, firsts = _run(core, reqs, device)
        ttft = sorted(firsts.values())
        out["levels"][str(n)] = {
            "tokens_per_s": round(n * output / wall, 1),
            "tpot_ms": round(1000 * (wall - ttft[len(ttft) // 2]) / max(output - 1, 1), 3),
            "ttft_p50_ms": round(1000 * ttft[len(ttft) // 2], 1),
        }
        print("engine", "async" if overlap else "serial", n, out["levels"][str(n)], flush=True)
    # sampled (T 0.8, top_p 0.95) at the middle level; then, over a shorter run, how often the
    # host waited for the device (torch's sync debug mode, which counts a tensor's read, not
    # an event's): in series the step's one read of its tokens is the floor (1 a step); with
    # --async-scheduling the tokens come through a pinned copy and an event (0 a step), and a
    # wait counted there is a read inside a launch, which keeps the steps from overlapping
    n = streams[len(streams) // 2]
    wall, _ = _run(core, [request(f"s{n}-{i}", prompt, output, True) for i in range(n)], device)
    out["sampled"] = {"streams": n, "tokens_per_s": round(n * output / wall, 1)}
    counted = max(output // 4, 2)
    with _host_waits(device) as waits:
        _run(core, [request(f"w{n}-{i}", prompt, counted, True) for i in range(n)], device)
    out["sampled"]["host_waits_per_step"] = (
        round(len(waits) / counted, 2) if device.type == "cuda" else None
    )
    out["join"] = _join_probe(core, request, device, 4 if quick else 64, output)
    return out


@contextmanager
def _host_waits(device: torch.device) -> Iterator[list[warnings.WarningMessage]]:
    """The synchronizing CUDA calls made inside, one warning each (none off CUDA)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    seen[:] = [w for w in seen if "synchroniz" in str(w.message)]


def _run(
    core: EngineCore, reqs: list[EngineCoreRequest], device: torch.device
) -> tuple[float, dict[str, float]]:
    """Add all, step until all finish: wall seconds and each request's first-token time."""
    start = time.perf_counter()
    for r in reqs:
        core.add_request(r)
    firsts: dict[str, float] = {}
    left = {r.request_id for r in reqs}
    while left:
        outputs, _ = core.step()
        now = time.perf_counter() - start
        for o in outputs:
            if o.new_token_ids and o.request_id not in firsts:
                firsts[o.request_id] = now
            if o.finished:
                left.discard(o.request_id)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, firsts


def _join_probe(core: EngineCore, request: Any, device: torch.device, n: int, output: int) -> Any:
    """A 16-token request added while `n` streams decode: its wait to a first token, against
    the same request's first token alone (its own prefill and one step)."""
    alone, _ = _run(core, [request("alone", 16, 1)], device)
    for i in range(n):
        core.add_request(request(f"bg{i}", PROMPT // 4, output * 8))
    for _ in range(8):  # everyone decoding
        core.step()
    added = time.perf_counter()
    core.add_request(request("joiner", 16, 1))
    first = None
    while first is None:
        outputs, _ = core.step()
        if any(o.request_id == "joiner" and o.new_token_ids for o in outputs):
            first = time.perf_counter() - added
    for i in range(n):
        core.abort_request(f"bg{i}")
    while core.has_work():
        core.step()
    return {
        "streams": n,
        "first_token_ms": round(1000 * first, 2),
        "alone_ms": round(1000 * alone, 2),
    }
