"""Replicas on a Ray cluster (`headrace serve --ray-address ADDRESS`): joining the cluster and
starting one replica as an actor with the resources it declares.

ADDRESS is `auto` (the cluster this machine's `ray start` joined), `ray://HOST:PORT` (Ray
Client), a GCS address `HOST:PORT`, or `local` (a private single-node Ray started here, to try
it). Each replica asks for `--num-threads` CPUs (default 1; also its torch threads) and, on
CUDA (`--device cuda`, or `auto` when the cluster has GPUs), one GPU; actors of one deployment
are spread over the nodes. Failed replicas are replaced by our supervisor, not by Ray's actor
restarts (`max_restarts=0`): one restart path, with backoff, for local and Ray replicas alike.

With `--ray-namespace NS` every replica is a named, detached actor, `headrace/MODEL/INDEX` in
namespace NS, created with get-if-exists semantics: the first front end creates it, any other
(or the same one after a restart) attaches to it; after a failure the first supervisor to
start it again creates the new one and the others attach to that. Detached actors outlive
their front ends: `headrace ray-down` removes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.client import EngineClient
from headrace.router.ray_actor import ReplicaActor, settings_of
from headrace.router.ray_replica import RayEngine

if TYPE_CHECKING:  # Ray is an optional extra
    from ray.actor import ActorClass

log = logging.getLogger("headrace.router")

LOOPBACK = "127.0.0.1"
ACTOR_PREFIX = "headrace/"


async def connect(address: str, namespace: str | None = None) -> None:
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
    await asyncio.to_thread(ray.init, **init_kwargs(address, namespace))
    resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
    log.warning("joined Ray at %s: %s", address, resources)


def init_kwargs(address: str, namespace: str | None = None) -> dict[str, Any]:
    """`ray.init` arguments. A cluster on this machine's loopback (and `local`) keeps every
    address on 127.0.0.1, so Ray advertises no outside interface. A Ray Client (`ray://`)
    runs no node here: its server on the cluster has the driver."""
    kwargs: dict[str, Any] = {"address": address}
    if namespace is not None:
        kwargs["namespace"] = namespace
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
    actor_name: str | None = None,
) -> Any:
    """A `router.replica.Starter` that creates the replica as a new Ray actor each time; with
    `actor_name` (replicas shared through a namespace), gets the live actor of that name if
    there is one, else creates it, detached."""
    import ray

    actor_class, model_config = _actor_class(model_config, actor_name)
    configs = (model_config, cache_config, scheduler_config)

    async def start() -> EngineClient:
        # get-if-exists looks the name up in the GCS: a blocking call, off the event loop
        actor: Any = await asyncio.to_thread(actor_class.remote, *configs, served_model_name)
        try:
            engine = await RayEngine.start(actor, shared=actor_name is not None)
        except Exception:  # its start failed: of no use to anyone
            ray.kill(actor, no_restart=True)
            raise
        except BaseException:  # never left pending or half started; a shared one, to others
            if actor_name is None:
                ray.kill(actor, no_restart=True)
            raise
        if actor_name is not None:
            await _check_settings(engine, settings_of(*configs, served_model_name), actor_name)
        log.warning(
            "replica of %s started on Ray node %s (%s)",
            served_model_name, engine.ready.node_ip, engine.ready.node_id[:12],
        )  # fmt: skip
        return engine

    return start


def _actor_class(
    model_config: ModelConfig, actor_name: str | None
) -> tuple[ActorClass[ReplicaActor], ModelConfig]:
    """The replica's actor class with the resources it declares; the settings with the device
    decided (with the GPU it declares)."""
    import ray

    resources = replica_resources(model_config)
    if model_config.device == "auto":  # decided here, with the GPU it declares
        device = "cuda" if resources["num_gpus"] else "cpu"
        model_config = dataclasses.replace(model_config, device=device)
    named = {} if actor_name is None else _named(actor_name)
    actor_class = ray.remote(ReplicaActor).options(
        **resources, max_restarts=0, max_concurrency=10_000, scheduling_strategy="SPREAD",
        **named,
    )  # fmt: skip
    return actor_class, model_config


def _named(actor_name: str) -> dict[str, Any]:
    return {"name": ACTOR_PREFIX + actor_name, "lifetime": "detached", "get_if_exists": True}


async def _check_settings(engine: RayEngine, expected: str, actor_name: str) -> None:
    """An existing actor of that name must run what this front end would have started; if it
    does not, it is left to whoever started it."""
    if engine.ready.settings != expected:
        await engine.close()
        raise RuntimeError(
            f"the Ray actor {ACTOR_PREFIX}{actor_name} runs other settings than this front end's "
            f"(model, cache or scheduler flags); remove it with `headrace ray-down` or use "
            f"another --ray-namespace.\n  it runs: {engine.ready.settings}\n  here:    {expected}"
        )


async def remove_shared(address: str, namespace: str) -> list[str]:
    """Kill every replica actor of namespace `namespace` (`headrace ray-down`); their names."""
    import ray

    await connect(address, namespace)
    named = await asyncio.to_thread(ray.util.list_named_actors)  # this namespace's
    names = sorted(n for n in named if n.startswith(ACTOR_PREFIX))
    for name in names:
        try:
            ray.kill(ray.get_actor(name), no_restart=True)
        except ValueError:  # gone meanwhile
            continue
    return names
