"""`headrace` command line: each subcommand lives in `headrace.commands.<name>`.

A command module defines `add_arguments(parser)` and `run(args) -> int`; modules import lazily
so that `headrace bench` does not pay for torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

COMMANDS = {
    "generate": "print a continuation of a prompt",
    "serve": "run the HTTP server",
    "export": "write the converted model as a Hugging Face directory",
    "bench": "load-test an OpenAI-compatible server",
    "plan": "size a replica pool from measured throughput",
    "usage": "export the usage ledger for billing (csv or jsonl)",
    "ray-down": "remove the Ray replicas that front ends share (--ray-namespace)",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="headrace", description="Headrace LLM inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    name = argv[0] if argv and argv[0] in COMMANDS else None
    for cmd, help_text in COMMANDS.items():
        p = sub.add_parser(cmd, help=help_text)
        if cmd == name:
            _module(cmd).add_arguments(p)
    args = parser.parse_args(argv)
    return int(_module(args.command).run(args) or 0)


def _module(cmd: str) -> ModuleType:
    return importlib.import_module(f"headrace.commands.{cmd.replace('-', '_')}")


if __name__ == "__main__":
    sys.exit(main())
