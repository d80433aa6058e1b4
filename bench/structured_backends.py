"""llguidance vs xgrammar on this machine, for Gemma 3's 262k vocabulary: tokenizer set-up,
grammar compile time for a typical schema (cold, then cached), and the per-step cost of the
token masks of 32 constrained streams walking through a JSON document.

The two engines need different environments (xgrammar pulls in transformers and triton), so
this runs in two steps; vLLM's venv (bench/peers/setup_vllm.sh) has both engines:

    .venv/bin/python bench/structured_backends.py --dump bench/out/structured/tokenizer.json
    bench/peers/.work/vllm-venv/bin/python bench/structured_backends.py \
        --tokenizer bench/out/structured/tokenizer.json

Prints JSON and writes bench/out/structured/backends.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "colour", "tags", "address"],
}
DOCUMENT = (
    '{"name": "Ada Lovelace", "age": 36, "colour": "blue", "tags": ["maths", "engines"], '
    '"address": {"city": "London", "zip": 10115}}'
)
STREAMS = 32
OUT = Path(__file__).resolve().parent / "out" / "structured"


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def run_llguidance(tok_json: str, ids: list[int], vocab: int, eos: list[int]) -> dict[str, Any]:
    import llguidance
    import torch

    tokenizer, setup = timed(lambda: llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=eos))
    opts = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=opts)
    _, cold = timed(lambda: llguidance.LLMatcher(tokenizer, grammar, log_level=0))
    matchers, warm = timed(
        lambda: [llguidance.LLMatcher(tokenizer, grammar, log_level=0) for _ in range(STREAMS)]
    )
    words = (vocab + 31) // 32
    mask = torch.full((STREAMS, words), -1, dtype=torch.int32)
    steps = []
    for token in ids:
        t0 = time.perf_counter()
        for k, m in enumerate(matchers):
            m.unsafe_compute_mask_ptr(mask[k].data_ptr(), words * 4)
        steps.append(time.perf_counter() - t0)
        for m in matchers:
            assert m.consume_token(token), m.get_error()
    return {
        "version": llguidance.__version__, "tokenizer_setup_s": setup, "compile_cold_s": cold,
        "compile_cached_s": warm / STREAMS, "mask_step_ms_p50": 1e3 * statistics.median(steps),
        "mask_step_ms_mean": 1e3 * statistics.fmean(steps),
    }  # fmt: skip


def run_xgrammar(tok_json: str, ids: list[int], vocab: int, eos: list[int]) -> dict[str, Any]:
    import tokenizers
    import transformers
    import xgrammar as xgr

    def info() -> Any:
        hf = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizers.Tokenizer.from_str(tok_json)
        )
        return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=eos)

    tok_info, setup = timed(info)
    compiler = xgr.GrammarCompiler(tok_info)
    schema = json.dumps(SCHEMA)
    compiled, cold = timed(lambda: compiler.compile_json_schema(schema, any_whitespace=False))
    _, warm = timed(lambda: compiler.compile_json_schema(schema, any_whitespace=False))
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(STREAMS)]
    mask = xgr.allocate_token_bitmask(STREAMS, vocab)
    steps = []
    for token in ids:
        t0 = time.perf_counter()
        for k, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, k)
        steps.append(time.perf_counter() - t0)
        for m in matchers:
            assert m.accept_token(token)
    return {
        "version": xgr.__version__ if hasattr(xgr, "__version__") else "?",
        "tokenizer_setup_s": setup, "compile_cold_s": cold, "compile_cached_s": warm,
        "mask_step_ms_p50": 1e3 * statistics.median(steps),
        "mask_step_ms_mean": 1e3 * statistics.fmean(steps),
    }  # fmt: skip


def dump(path: Path) -> None:
    """The embedded Gemma's tokenizer as Hugging Face JSON, with its vocabulary size and EOS."""
    from headrace.loader.cache import resolve_model
    from headrace.loader.tokenizer import load_tokenizer

    model_dir, _ = resolve_model(None)
    tok = load_tokenizer(model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tok.backend.to_str())
    meta = {"vocab_size": 262144, "eos": list(tok.eos_token_ids)}
    path.with_suffix(".meta.json").write_text(json.dumps(meta))
    print(f"wrote {path}", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dump", type=Path, help="write the tokenizer JSON here and stop")
    p.add_argument("--tokenizer", type=Path, help="a tokenizer JSON written by --dump")
    args = p.parse_args()
    if args.dump:
        dump(args.dump)
        return 0
    import tokenizers

    tok_json = args.tokenizer.read_text()
    meta = json.loads(args.tokenizer.with_suffix(".meta.json").read_text())
    ids = tokenizers.Tokenizer.from_str(tok_json).encode(DOCUMENT, add_special_tokens=False).ids
    result: dict[str, Any] = {"streams": STREAMS, "document_tokens": len(ids)}
    for name, fn in (("llguidance", run_llguidance), ("xgrammar", run_xgrammar)):
        try:
            result[name] = fn(tok_json, ids, meta["vocab_size"], meta["eos"])
        except ImportError as e:
            result[name] = {"error": f"not installed here: {e}"}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "backends.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
