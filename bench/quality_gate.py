"""Quality gate of a lossy setting (bf16, fp16) against the fp32 path, on Headrace's own runner.

- Perplexity on a held-out English text shipped with the tests (`tests/data/heldout_gpl3.txt`,
  the GPL-3 licence text, ~7k tokens), in windows of `--window` tokens, each scored by one
  prefill through the paged-KV model path (every position's next-token log-probability).
- Perplexity of decode-sized steps: the first `--decode-tokens` tokens of the same text, in the
  same windows, scored `--decode-rows` tokens a step (each step attends to the window's earlier
  tokens in the cache), as a decode step of that many rows computes them: the paths that serve
  only small steps (`--gguf-blocks`, the bf16 decode matmul) are scored here, not by a prefill.
- Greedy agreement on a fixed prompt set (`tests/data/gate_prompts.txt`, 200 sentence openings
  from other licence texts) × `--max-tokens` greedy tokens: the share of prompts whose output
  is identical to fp32's, and the mean share of tokens before the first difference.

Prints JSON and writes it under --out. A lossy setting may be a default only with perplexity
within +1% of fp32 (docs/performance.md).

    .venv/bin/python bench/quality_gate.py                        # fp32 vs bf16, Gemma 3 270M
    .venv/bin/python bench/quality_gate.py --dtypes float32,float16 --prompts 50
    .venv/bin/python bench/quality_gate.py --dtypes float32,bfloat16,bfloat16-torch \
        --max-num-seqs 4      # at most 4 rows a step: the int8 greedy head serves every step

A `-torch` suffix turns the CPU kernels off for that setting (kernels/: in-place decode
attention, the exact int8 greedy head), to compare them with the torch paths; `-nospec` turns
speculative decoding off (its default: on while at most 4 requests run, engine.md).

    .venv/bin/python bench/quality_gate.py --dtypes float32-nospec,bfloat16-nospec,bfloat16 \
        --max-num-seqs 4      # greedy agreement with drafts checked in chunks vs one by one

`-int8` / `-noint8` set `--int8-matmuls on` / `off` for that setting (default: `auto`);
`-noblocks` sets `--gguf-blocks off`; `-nosgmv` computes LoRA terms on torch's path.

    .venv/bin/python bench/quality_gate.py --dtypes float32,bfloat16-noblocks,bfloat16 \
        --max-num-seqs 4      # decode steps on the GGUF's own blocks vs its bf16 weights

    .venv/bin/python bench/quality_gate.py --dtypes float32,bfloat16-noint8,bfloat16-int8 \
        --max-num-seqs 4

`--lora PATH` scores every setting with that PEFT adapter on every request (`--lora random`:
a random rank-16 adapter on all seven projections, bench/lora.py's at `--b-scale 0.1`), so
that bf16's LoRA terms (kernels/lora_sgmv.py) are gated against fp32's:

    .venv/bin/python bench/quality_gate.py --lora random --max-num-seqs 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.llm import LLM
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.kernels import lora_sgmv
from headrace.kernels.build import cpu_kernels
from headrace.request import SamplingParams

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
LORA = "gate"  # the adapter's name in each setting's runner


def perplexity(
    llm: LLM, ids: list[int], window: int, rows: int = 0, lora_id: int = 0
) -> tuple[float, int]:
    """exp(mean NLL) over every position of `ids` scored in windows, each in one step (`rows`
    0) or in steps of `rows` tokens, with the LoRA adapter `lora_id` (0: none); returns (ppl,
    tokens)."""
    runner: Any = llm.core.runner
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        if len(chunk) < 2:
            break
        inputs, targets = chunk[:-1], torch.tensor(chunk[1:])
        blocks = list(range(math.ceil(len(inputs) / runner.block_size)))
        step = rows or len(inputs)
        for at in range(0, len(inputs), step):
            part = inputs[at : at + step]
            params = SamplingParams()
            req = ScheduledRequest("ppl", part, at, blocks, True, params, 0, lora_id=lora_id)
            loss, n = _score(runner, req, targets[at : at + step])
            nll, count = nll + loss, count + n
    return math.exp(nll / count), count


def _score(runner: Any, req: ScheduledRequest, targets: torch.Tensor) -> tuple[float, int]:
    """The step's summed NLL of `targets` and their count."""
    step = build_step_inputs(
        [req], runner.block_size, runner.model.args.windows, runner.device, runner.dtype
    )
    runner.loras.set_rows(step.lora_segments)
    nll = 0.0
    with torch.inference_mode():
        hidden = runner.model(step.input_ids, step.positions, runner.kv_cache.layers, step.meta)
        for r0 in range(0, len(targets), 128):  # [128, V] logits at a time: 262k vocab
            logits = runner.model.compute_logits(hidden[r0 : r0 + 128]).float()
            lp = torch.log_softmax(logits, dim=-1)
            t = targets[r0 : r0 + 128].to(lp.device)
            nll -= float(lp.gather(1, t[:, None]).sum())
    return nll, len(targets)


def greedy(llm: LLM, prompts: list[str], max_tokens: int, lora: str | None) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(prompts, params, lora=lora)]


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    same = sum(a == b for a, b in zip(ref, got, strict=True))
    prefix = []
    for a, b in zip(ref, got, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        prefix.append(k / max(1, len(a)))
    return {"identical_share": same / len(ref), "mean_agreeing_prefix": sum(prefix) / len(ref)}


def evaluate(dtype: str, args: argparse.Namespace, text: str, prompts: list[str]) -> dict[str, Any]:
    t0 = time.monotonic()
    base, *flags = dtype.split("-")
    torch_paths = "torch" in flags
    if torch_paths:  # every kernel off for this setting: the runner takes its torch paths
        os.environ["HEADRACE_CPU_KERNELS"] = "0"
        cpu_kernels.cache_clear()
    llm = LLM(
        ModelConfig(
            model=args.model,
            dtype=base,
            device="cpu",
            int8_matmuls="off" if "noint8" in flags else "on" if "int8" in flags else "auto",
            gguf_blocks="off" if "noblocks" in flags else "auto",
            max_model_len=args.window + 64,
        ),
        CacheConfig(num_kv_blocks=2048),
        SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=1024,
            num_speculative_tokens=0
            if "nospec" in flags
            else SchedulerConfig.num_speculative_tokens,
        ),
    )
    llm.core.runner.wait_greedy_head()  # every step of the run with the head it will have
    sgmv_usable = lora_sgmv.usable
    if "nosgmv" in flags:
        lora_sgmv.usable = lambda x, y: False  # type: ignore[assignment]
    lora_id = load_lora(llm, args) if args.lora else 0
    ids = llm.tokenizer.encode(text, add_special_tokens=True)
    ppl, n = perplexity(llm, ids, args.window, lora_id=lora_id)
    decode_ppl, decode_n = perplexity(
        llm, ids[: args.decode_tokens], args.window, args.decode_rows, lora_id
    )
    outputs = greedy(llm, prompts, args.max_tokens, LORA if args.lora else None)
    lora_sgmv.usable = sgmv_usable  # type: ignore[assignment]
    if torch_paths:
        os.environ.pop("HEADRACE_CPU_KERNELS", None)
        cpu_kernels.cache_clear()
    return {"dtype": dtype, "perplexity": ppl, "scored_tokens": n, "outputs": outputs,
            "decode_perplexity": decode_ppl, "decode_scored_tokens": decode_n,
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def load_lora(llm: LLM, args: argparse.Namespace) -> int:
    """The adapter's id in this setting's runner; `random` writes one the first time."""
    runner: Any = llm.core.runner
    if args.lora == "random":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from lora import write_adapter  # beside this script

        args.lora = Path(tempfile.mkdtemp(prefix="gate-lora-")) / "adapter"
        write_adapter(runner, args.lora, rank=16, seed=0, b_scale=0.1)
    lora_id: int = runner.loras.load(LORA, args.lora)
    return lora_id


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="default: the embedded Gemma 3 270M")
    p.add_argument("--dtypes", default="float32,bfloat16", help="the first is the reference")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=64, help="of the greedy generation")
    p.add_argument("--decode-tokens", type=int, default=2048, help="scored in small steps")
    p.add_argument("--decode-rows", type=int, default=1, help="tokens a step when so scored")
    p.add_argument("--out", type=Path, default=Path("bench/out/quality_gate"))
    p.add_argument("--lora", default=None, help="a PEFT adapter directory for every request, or "
                   "'random' (rank 16 on every projection)")  # fmt: skip
    args = p.parse_args()
    text = (DATA / "heldout_gpl3.txt").read_text()
    prompts = (DATA / "gate_prompts.txt").read_text().splitlines()[: args.prompts]
    results = [evaluate(d, args, text, prompts) for d in args.dtypes.split(",")]
    ref = results[0]
    report = []
    for r in results:
        report.append({
            "dtype": r["dtype"], "perplexity": round(r["perplexity"], 4),
            "perplexity_vs_reference": round(r["perplexity"] / ref["perplexity"] - 1, 5),
            "scored_tokens": r["scored_tokens"], "prompts": len(prompts),
            "decode_perplexity": round(r["decode_perplexity"], 4),
            "decode_perplexity_vs_reference": round(
                r["decode_perplexity"] / ref["decode_perplexity"] - 1, 5),
            "decode_scored_tokens": r["decode_scored_tokens"],
            "max_tokens": args.max_tokens, **agreement(ref["outputs"], r["outputs"]),
            "gate_ppl_within_1pct": r["perplexity"] <= ref["perplexity"] * 1.01
            and r["decode_perplexity"] <= ref["decode_perplexity"] * 1.01,
            "seconds": r["seconds"],
        })  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"reference": ref["dtype"], "lora": str(args.lora) if args.lora else None}
    text_out = json.dumps(doc | {"results": report}, indent=2)
    (args.out / "quality_gate.json").write_text(text_out)
    print(text_out)


if __name__ == "__main__":
    main()
