"""vLLM's `bench serve` as a second, neutral client of compare.py: random-token prompts, run
from the vLLM venv against any OpenAI-compatible server on 127.0.0.1, one level at a time.

Its defaults here are the issue's: prompts of 128-384 random tokens, 32-96 output tokens
(`--random-input-len 256 --random-output-len 64 --random-range-ratio 0.5`), `ignore_eos`,
greedy unless a temperature (and top_p) is given, closed loop at `--max-concurrency` streams;
a fresh seed per level, so no level replays another's prompts.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VLLM_PY = HERE / ".work" / "vllm-venv" / "bin" / "python"


def available() -> bool:
    return VLLM_PY.exists()


def served_model(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as resp:
        return str(json.load(resp)["data"][0]["id"])


def run_level(
    url: str,
    tokenizer: str,
    level: int,
    num_prompts: int,
    seed: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(VLLM_PY), str(HERE / "vllm_bench_serve.py"),
            "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", served_model(url), "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", "256",
            "--random-output-len", "64", "--random-range-ratio", "0.5",
            "--ignore-eos", "--temperature", str(temperature), "--top-p", str(top_p),
            "--max-concurrency", str(level),
            "--num-prompts", str(num_prompts), "--seed", str(seed), "--num-warmups", "0",
            "--save-result", "--result-dir", tmp, "--result-filename", "r.json",
            "--disable-tqdm", "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,95",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        path = Path(tmp) / "r.json"
        if done.returncode or not path.exists():
            return {"concurrency": level, "error": done.stderr[-2000:]}
        r = json.loads(path.read_text())
    return {
        "concurrency": level,
        "output_tokens_per_s": r["output_throughput"],
        "ttft_p50_s": r["p50_ttft_ms"] / 1e3,
        "ttft_p95_s": r["p95_ttft_ms"] / 1e3,
        "tpot_p50_s": r["p50_tpot_ms"] / 1e3,
        "completed": r["completed"],
        "failed": r["failed"],
        "total_input_tokens": r["total_input_tokens"],
        "total_output_tokens": r["total_output_tokens"],
    }
