"""Replicas on a Ray cluster (`headrace serve --ray-address ADDRESS`): joining the cluster and
starting one replica as an actor with the resources it declares.

ADDRESS is `auto` (the cluster this machine's `ray start` joined), `ray://HOST:PORT` (Ray
Client), a GCS address `HOST:PORT`, or `local` (a private single-node Ray started here, to try
it). Each replica asks for `--num-threads` CPUs (default 1; also its torch threads) and, on
CUDA (`--device cuda`, or `auto` when the cluster has GPUs), one GPU; actors of one deployment
are spread over the nodes. Failed replicas are replaced by our supervisor, not by Ray's actor
restarts (`max_restarts=0`): one restart path, with backoff, for local and Ray replicas alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import socket
from typing import Any

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.client import EngineClient
from headrace.router.ray_actor import ReplicaActor
from headrace.router.ray_replica import RayEngine

log = logging.getLogger("headrace.router")

LOOPBACK = "127.0.0.1"


async def connect(address: str) -> None:
    """Join (or, for `local`, start) the Ray cluster; once per process."""
    # Read when Ray is first imported. Ray's native crash handler would take SIGTERM from
    # uvicorn's and abort the process instead of stopping it cleanly.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("--ray-address needs Ray: pip install 'headrace[ray]'") from e

    if ray.is_initialized():
        return
    await asyncio.to_thread(ray.init, **init_kwargs(address))
    resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
    log.warning("joined Ray at %s: %s", address, resources)


def init_kwargs(address: str) -> dict[str, Any]:
    """`ray.init` arguments. A cluster on this machine's loopback (and `local`) keeps every
    address on 127.0.0.1, so Ray advertises no outside interface. A Ray Client (`ray://`)
    runs no node here: its server on the cluster has the driver."""
    kwargs: dict[str, Any] = {"address": address}
    if address == "local":  # small objects only (token ids, text, stats)
        kwargs.update(include_dashboard=False, object_store_memory=256 << 20)
    if address == "local" or _is_loopback(address):
        kwargs["_node_ip_address"] = LOOPBACK
    return kwargs


def _is_loopback(address: str) -> bool:
    if address.startswith("ray://"):
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("", "auto"):
        return False
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def replica_resources(model_config: ModelConfig) -> dict[str, float]:
    """What one replica declares: CPUs for its threads, a GPU on CUDA."""
    import ray

    cluster: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    gpus = 1.0 if uses_cuda(model_config.device, cluster) else 0.0
    return {"num_cpus": float(model_config.num_threads or 1), "num_gpus": gpus}


def uses_cuda(device: str, cluster_resources: dict[str, float]) -> bool:
    if device == "auto":
        return cluster_resources.get("GPU", 0.0) > 0
    return device.startswith("cuda")


def ray_starter(
    model_config: ModelConfig,
    cache_config: CacheConfig,
    scheduler_config: SchedulerConfig,
    served_model_name: str,
) -> Any:
    """A `router.replica.Starter` that creates the replica as a new Ray actor each time."""
    import ray

    resources = replica_resources(model_config)
    if model_config.device == "auto":  # decided here, with the GPU it declares
        device = "cuda" if resources["num_gpus"] else "cpu"
        model_config = dataclasses.replace(model_config, device=device)
    actor_class = ray.remote(ReplicaActor).options(
        **resources, max_restarts=0, max_concurrency=10_000, scheduling_strategy="SPREAD"
    )

    async def start() -> EngineClient:
        configs = (model_config, cache_config, scheduler_config)
        actor: Any = actor_class.remote(*configs, served_model_name)
        try:
            engine = await RayEngine.start(actor)
        except BaseException:  # never left pending or half started
            ray.kill(actor, no_restart=True)
            raise
        log.warning(
            "replica of %s started on Ray node %s (%s)",
            served_model_name, engine.ready.node_ip, engine.ready.node_id[:12],
        )  # fmt: skip
        return engine

    return start
