"""The front end ⇄ core boundary: bytes and encode + decode time per message, pickle (what the
process core used before `engine/messages.py`) against msgspec's MessagePack (what it uses now).

Messages: a step report of 32 decoding requests (one token each) and of 32 with top-5 logprobs,
a request of 300 prompt tokens, and the ready message, whose pickled form used to carry the
model's tokenizer (measured here on the embedded Gemma's). Medians of `--repeat` timings of
`--number` calls each. Prints JSON.

    .venv/bin/python bench/boundary_messages.py
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

from headrace.engine.messages import (
    CoreOutputs,
    CoreReady,
    EngineCoreRequest,
    RequestOutput,
    StepStats,
    TokenLogprobs,
    decode_from_core,
    decode_to_core,
    encode,
)
from headrace.request import SamplingParams


def step_report(n: int, top: int) -> CoreOutputs:
    def logprobs(i: int) -> list[TokenLogprobs]:
        if not top:
            return []
        return [TokenLogprobs(i, -0.5, [(i + k, -1.0 - k) for k in range(top)])]

    outputs = [RequestOutput(f"cmpl-{i:024x}#7", [1000 + i], None, 300, 40, logprobs(i))
               for i in range(n)]  # fmt: skip
    stats = StepStats(0.05, n, 3, n, 0, n, 500, 4000, waiting_by_priority=((0, 1, 300),))
    return CoreOutputs(outputs, stats)


def request(tokens: int) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, stop=("\n\n",))
    ids = [(i * 7919) % 262_000 for i in range(tokens)]
    return EngineCoreRequest("cmpl-0123456789abcdef#1", ids, params, tenant="acme",
                             arrival_time=time.monotonic(), eos_token_ids=(1, 106))  # fmt: skip


def timed(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Median microseconds per call."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number * 1e6)
    return round(statistics.median(runs), 2)


def compare(
    msg: Any, decode: Callable[[bytes], object], number: int, repeat: int
) -> dict[str, Any]:
    pickled = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    packed = encode(msg)
    assert decode(packed) == msg and pickle.loads(pickled) == msg
    return {
        "pickle": {"bytes": len(pickled),
                   "encode_us": timed(lambda: pickle.dumps(msg, protocol=5), number, repeat),
                   "decode_us": timed(lambda: pickle.loads(pickled), number, repeat)},
        "msgpack": {"bytes": len(packed),
                    "encode_us": timed(lambda: encode(msg), number, repeat),
                    "decode_us": timed(lambda: decode(packed), number, repeat)},
    }  # fmt: skip


def ready_sizes() -> dict[str, Any]:
    """The ready message now, and what pickling the tokenizer into it cost."""
    from headrace.loader.cache import resolve_model
    from headrace.loader.tokenizer import load_tokenizer

    model_dir, name = resolve_model(None)
    tok = load_tokenizer(model_dir)
    ready = CoreReady(name, 32768, 4000, 16, (1, 106), {"device": "cpu", "dtype": "bfloat16"})
    t0 = time.perf_counter()
    blob = pickle.dumps(tok, protocol=pickle.HIGHEST_PROTOCOL)
    dumps_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pickle.loads(blob)
    loads_s = time.perf_counter() - t0
    return {"msgpack_bytes": len(encode(ready)), "pickled_tokenizer_bytes": len(blob),
            "pickled_tokenizer_dumps_s": round(dumps_s, 3),
            "pickled_tokenizer_loads_s": round(loads_s, 3)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-ready", action="store_true", help="skip the tokenizer (Gemma) part")
    args = ap.parse_args()
    n, r = args.number, args.repeat
    result: dict[str, Any] = {
        "step_report_32": compare(step_report(32, 0), decode_from_core, n, r),
        "step_report_32_top5": compare(step_report(32, 5), decode_from_core, n, r),
        "request_300_tokens": compare(request(300), decode_to_core, n, r),
    }
    if not args.no_ready:
        result["ready"] = ready_sizes()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
