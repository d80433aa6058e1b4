"""`headrace generate --prompt "..."`: print a continuation, streamed as it is generated."""

from __future__ import annotations

import argparse
import sys

from headrace.config import (
    CacheConfig,
    ModelConfig,
    SchedulerConfig,
    add_config_args,
    config_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None, help="same seed, same text")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="run to --max-tokens")
    for cls in (ModelConfig, CacheConfig, SchedulerConfig):
        add_config_args(parser, cls)


def run(args: argparse.Namespace) -> int:
    from headrace.engine.llm import LLM
    from headrace.request import SamplingParams

    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
        model = config_from_args(ModelConfig, args)
        cache = config_from_args(CacheConfig, args)
        sched = config_from_args(SchedulerConfig, args)
    except ValueError as e:
        print(f"headrace generate: {e}", file=sys.stderr)
        return 2
    llm = LLM(model, cache, sched)

    def show(chunk: object) -> None:
        sys.stdout.write(getattr(chunk, "text", ""))
        sys.stdout.flush()

    try:
        [out] = llm.generate(args.prompt, params, on_chunk=show)
    except ValueError as e:
        print(f"\nheadrace generate: {e}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    print(
        f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}]",
        file=sys.stderr,
    )
    return 0 if out.error is None else 1
