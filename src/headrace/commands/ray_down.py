"""`headrace ray-down`: remove the shared replicas (named, detached Ray actors) that front ends
started with `--ray-namespace` left running on the cluster (docs/scale-out.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from headrace.router.ray_cluster import remove_shared

log = logging.getLogger("headrace.ray")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", required=True, help="as for `headrace serve`")
    parser.add_argument("--ray-namespace", required=True, help="as for `headrace serve`")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:
        names = asyncio.run(remove_shared(args.ray_address, args.ray_namespace))
    except RuntimeError as e:  # no Ray installed
        log.error("%s", e)
        return 2
    for name in names:
        print(f"removed {name}")
    if not names:
        print(f"no replicas in Ray namespace {args.ray_namespace!r}")
    return 0
