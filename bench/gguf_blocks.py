"""Decode on a GGUF's own quantized blocks (`--gguf-blocks auto`) against the bf16 weights
(`off`), engine alone, one process: output tokens/s at a few streams, greedy and sampled.

The embedded Gemma 3 270M loads once; the two settings alternate round by round (the blocks are
taken off the projections and put back), so each ratio comes from the same minutes of this noisy
host. Every request has `ignore_eos` and `--max-tokens` tokens; the scheduler runs at the
server's defaults (prompt-lookup speculation included), `--streams` requests at a time. Prints
JSON and writes it under --out.

    .venv/bin/python bench/gguf_blocks.py
    .venv/bin/python bench/gguf_blocks.py --streams 1,2,4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.llm import LLM
from headrace.engine.runner.model_runner import ModelRunner
from headrace.layers.linear import MergedLinear
from headrace.loader.cache import resolve_model
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
SETTINGS: dict[str, dict[str, float]] = {
    "greedy": {"temperature": 0.0},
    "t0.8": {"temperature": 0.8},
    "t1.0p0.95": {"temperature": 1.0, "top_p": 0.95},
}


def tokens_per_s(llm: LLM, prompts: list[str], streams: int, params: SamplingParams) -> float:
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), streams):
        tokens += sum(len(o.token_ids) for o in llm.generate(prompts[i : i + streams], params))
    return tokens / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", default="1,2")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "gguf_blocks"))
    args = p.parse_args()
    runner = ModelRunner(ModelConfig(), CacheConfig())
    runner.wait_greedy_head()
    blocks = {m: m.blocks for m in runner.model.modules() if isinstance(m, MergedLinear)}
    if not any(blocks.values()):
        print(json.dumps({"unavailable": "no projection took GGUF blocks here"}))
        return 1
    llm = LLM(runner=runner, tokenizer=load_tokenizer(resolve_model(None)[0]))
    data = ROOT / "tests" / "data" / "gate_prompts.txt"
    prompts = [line for line in data.read_text().splitlines() if line.strip()][: args.prompts]
    llm.generate(prompts[:2], SamplingParams(max_tokens=8))  # warm-up
    rows: list[dict[str, Any]] = []
    for streams in (int(s) for s in args.streams.split(",")):
        for name, sampling in SETTINGS.items():
            params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, **sampling)  # type: ignore[arg-type]
            got: dict[str, list[float]] = {"blocks": [], "bf16": []}
            for _ in range(args.rounds):
                for side in ("blocks", "bf16"):
                    for module, b in blocks.items():
                        module.blocks = b if side == "blocks" else None
                    got[side].append(tokens_per_s(llm, prompts, streams, params))
            row = {"streams": streams, "sampling": name, **got}
            row["ratio"] = statistics.median(got["blocks"]) / statistics.median(got["bf16"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"projections_with_blocks": sum(b is not None for b in blocks.values()), "rows": rows}
    (out / "gguf_blocks.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
