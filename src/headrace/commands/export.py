"""`headrace export --model PATH --out DIR [--dtype bfloat16]`: the converted model as a dense
Hugging Face directory (config.json, model.safetensors, tokenizer files) for transformers."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="GGUF file or HF directory (default: Gemma 3 270M)"
    )
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="weight dtype")


def run(args: argparse.Namespace) -> int:
    import torch

    from headrace.loader.cache import resolve_model
    from headrace.loader.errors import ModelLoadError
    from headrace.loader.export import export_model

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        model_dir, _ = resolve_model(args.model)
        out = export_model(model_dir, Path(args.out), getattr(torch, args.dtype))
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0
