"""`headrace ray-down`: remove the shared replicas (named, detached Ray actors) that front ends
started with `--ray-namespace` left running on the cluster (docs/scale-out.md); the audit log
(docs/ledger.md) records it."""

from __future__ import annotations

import argparse
import asyncio
import logging

from headrace.ledger.setup import record_action
from headrace.router.ray_cluster import remove_shared

log = logging.getLogger("headrace.ray")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", required=True, help="as for `headrace serve`")
    parser.add_argument("--ray-namespace", required=True, help="as for `headrace serve`")
    parser.add_argument(
        "--ledger", help="the audit log to record this in, as for `headrace serve` (off: none)"
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    arguments = {"ray_address": args.ray_address, "ray_namespace": args.ray_namespace}
    try:
        names = asyncio.run(remove_shared(args.ray_address, args.ray_namespace))
    except RuntimeError as e:  # no Ray installed
        log.error("%s", e)
        record_action(args.ledger, "replicas.ray_down", arguments, 500, {"error": str(e)})
        return 2
    record_action(args.ledger, "replicas.ray_down", arguments, 200, {"removed": names})
    for name in names:
        print(f"removed {name}")
    if not names:
        print(f"no replicas in Ray namespace {args.ray_namespace!r}")
    return 0
