"""A deployment: which models, how many replicas of each, where — started and put behind one
router per model.

`--model [NAME=]PATH[:N]` (repeatable) names a model, its files and its replica count (else
`--replicas`); `--replica-url URL` (repeatable) adds another `headrace serve` as a replica of
the model it serves — of a local model of that name, or of a model served only remotely (its
tokenizer is fetched from there). Local replicas are engine-core processes that share the
machine's CPU cores: each gets `cores // replicas` torch threads unless `--num-threads` is set.
With `--autoscale MIN:MAX` each local model starts MIN replicas (threads sized for MAX) and an
autoscaler adds and removes them at run time (docs/autoscale.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from headrace.config import (
    AutoscaleConfig,
    CacheConfig,
    HeadraceConfig,
    ModelConfig,
    RouterConfig,
    SchedulerConfig,
)
from headrace.engine.frontend.client import EngineClient
from headrace.router.autoscale_loop import AutoscaleLoop
from headrace.router.autoscaler import Autoscaler
from headrace.router.lora_changes import LoraChanges
from headrace.router.remote import RemoteEngine
from headrace.router.replica import Replica, Starter
from headrace.router.replica_set import LocalReplicaSet
from headrace.router.router import Router

_SPEC = re.compile(r"^(?:(?P<name>[\w.\-]+)=)?(?P<path>.*?)(?::(?P<n>\d+))?$")


@dataclass(frozen=True)
class ModelSpec:
    model: str | None  # a GGUF file or HF directory; None: the embedded Gemma 3 270M
    name: str  # what clients put in `model`
    replicas: int


def parse_model_specs(
    texts: Sequence[str | None],
    served_model_name: str | None,
    default_replicas: int,
    default_name: Callable[[str | None], str],
) -> list[ModelSpec]:
    """`[NAME=]PATH[:N]` each; `--served-model-name` names the model when there is one."""
    specs = []
    for text in texts:
        if text is None:
            specs.append(ModelSpec(None, served_model_name or default_name(None), default_replicas))
            continue
        m = _SPEC.match(text)
        assert m is not None  # the pattern matches any string
        path = m["path"] or None
        name = m["name"] or (served_model_name if len(texts) == 1 else None)
        n = int(m["n"]) if m["n"] is not None else default_replicas
        specs.append(ModelSpec(path, name or default_name(path), n))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"two models have the same name in {names}; use NAME=PATH")
    return specs


def threads_per_replica(num_replicas: int, cores: int | None = None) -> int:
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // max(num_replicas, 1))


# model, replica name, pool, starter
_Plan = tuple[str, str, str, Starter]


async def start_deployment(
    specs: Sequence[ModelSpec], config: HeadraceConfig, replica_urls: Sequence[str] = ()
) -> dict[str, Router]:
    """Start every replica (in parallel), connect the remote ones, one router per model.

    A replica that fails to start fails the whole deployment: what started is closed again.
    """
    bounds = config.autoscale.bounds
    if bounds is not None:  # start MIN; MAX sets the threads each one gets
        specs = [dataclasses.replace(s, replicas=bounds[0]) if s.replicas else s for s in specs]
    threads, cache_cfg = await _placement(specs, config)
    changes = {spec.name: LoraChanges() for spec in specs}  # the routers' lora_changes
    plans, starters = _plan(specs, config, threads, cache_cfg, changes)
    started = await _gather([p[3]() for p in plans])
    replicas: dict[str, list[Replica]] = {s.name: [] for s in specs}
    for (model, name, pool, starter), engine in zip(plans, started, strict=True):
        replicas[model].append(Replica(name, engine, pool=pool, starter=starter))
    try:
        await _add_remotes(replicas, replica_urls, config.router)
        _drop_empty(replicas, specs)
    except BaseException:
        await _close_all([r.engine for reps in replicas.values() for r in reps])
        raise
    routers = {model: Router(model, reps, config.router) for model, reps in replicas.items()}
    for model, router in routers.items():
        router.lora_changes = changes.get(model, router.lora_changes)
        if bounds is not None and model in starters and any(r.starter for r in router.replicas):
            _autoscale(router, starters[model], config.autoscale)
        router.start()
    return routers


async def _placement(specs: Sequence[ModelSpec], config: HeadraceConfig) -> tuple[int, CacheConfig]:
    """The torch threads each replica gets and the cache settings they share (connecting to
    Ray first where it runs them)."""
    router_cfg, cache_cfg, bounds = config.router, config.cache, config.autoscale.bounds
    long_n = router_cfg.long_replicas
    sized = [
        dataclasses.replace(s, replicas=bounds[1]) if bounds and s.replicas else s for s in specs
    ]
    total = sum(s.replicas + (long_n if s.replicas else 0) for s in sized)
    threads = config.model.num_threads or threads_per_replica(total)
    if router_cfg.ray_address is not None:  # CPUs each actor declares: 1 unless said
        from headrace.router.ray_cluster import connect

        await connect(router_cfg.ray_address, router_cfg.ray_namespace)
        threads = config.model.num_threads or 1
    if router_cfg.ray_address is None and total > 1:  # on CUDA they share one device
        share = cache_cfg.gpu_memory_utilization / total
        cache_cfg = dataclasses.replace(cache_cfg, gpu_memory_utilization=share)
    return threads, cache_cfg


def _plan(
    specs: Sequence[ModelSpec],
    config: HeadraceConfig,
    threads: int,
    cache_cfg: CacheConfig,
    changes: dict[str, LoraChanges],
) -> tuple[list[_Plan], dict[str, Starter]]:
    """The replicas to start, each with its starter; and per model the autoscaler's starter."""
    router_cfg, sched_cfg, long_n = config.router, config.scheduler, config.router.long_replicas
    plans: list[_Plan] = []
    starters: dict[str, Starter] = {}
    for spec in specs:
        cfg = dataclasses.replace(
            config.model, model=spec.model, served_model_name=spec.name, num_threads=threads
        )
        # the autoscaler's replicas are never shared by name
        starters[spec.name] = _starter(
            cfg, cache_cfg, sched_cfg, spec.name, router_cfg.ray_address, None, changes[spec.name]
        )
        names = [(f"{spec.name}/{i}", "main") for i in range(spec.replicas)]
        names += [(f"{spec.name}/long-{i}", "long") for i in range(long_n if spec.replicas else 0)]
        for name, pool in names:
            actor_name = name if router_cfg.ray_namespace is not None else None  # shared
            starter = _starter(
                cfg, cache_cfg, sched_cfg, spec.name, router_cfg.ray_address, actor_name,
                changes[spec.name],
            )  # fmt: skip
            plans.append((spec.name, name, pool, starter))
    return plans, starters


def _drop_empty(replicas: dict[str, list[Replica]], specs: Sequence[ModelSpec]) -> None:
    """The implicit model goes if it has no replica; ValueError if any other model has none."""
    implicit = {s.name for s in specs if s.model is None}  # `--replicas 0`, no --model
    for model in [m for m, reps in replicas.items() if not reps and m in implicit]:
        del replicas[model]
    empty = [model for model, reps in replicas.items() if not reps]
    if empty or not replicas:
        raise ValueError(f"model(s) {empty} have no replica: N=0 and no --replica-url")


def _starter(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    sched_cfg: SchedulerConfig,
    name: str,
    ray_address: str | None = None,
    actor_name: str | None = None,
    lora_changes: LoraChanges | None = None,
) -> Starter:
    if ray_address is not None:  # Ray is an optional extra: imported only when asked for
        from headrace.router.ray_cluster import ray_starter

        starter: Starter = ray_starter(model_cfg, cache_cfg, sched_cfg, name, actor_name)
        return starter

    async def start() -> EngineClient:
        from headrace.engine.frontend.async_engine import AsyncEngine

        engine = await AsyncEngine.start(model_cfg, cache_cfg, sched_cfg, served_model_name=name)
        if lora_changes is not None:  # a restart or a new replica: the adapters of its peers
            await lora_changes.replay(engine)
        return engine

    return start


def _autoscale(router: Router, starter: Starter, cfg: AutoscaleConfig) -> None:
    policy = Autoscaler(cfg, time.monotonic)
    router.autoscaler = AutoscaleLoop(router, LocalReplicaSet(router, starter), policy)


async def _add_remotes(
    replicas: dict[str, list[Replica]], urls: Sequence[str], cfg: RouterConfig
) -> None:
    """Each remote server becomes a replica of every model it serves."""
    api_key = cfg.replica_api_key
    if urls:  # httpx logs every request at INFO: the stats polls would flood the log
        logging.getLogger("httpx").setLevel(logging.WARNING)
    for url in urls:
        for model in await _models_at(url, api_key):
            local = replicas.setdefault(model, [])
            tokenizer = local[0].info.tokenizer if local else None  # else: fetched from there
            engine = await RemoteEngine.connect(
                url, model, tokenizer=tokenizer, api_key=api_key,
                read_timeout_s=cfg.replica_read_timeout_s,
            )  # fmt: skip
            index = sum(1 for r in local if r.url is not None)
            local.append(Replica(f"{model}/remote-{index}", engine, url=url))


async def _models_at(url: str, api_key: str | None) -> list[str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(headers=headers) as client:
        try:
            resp = await client.get(url.rstrip("/") + "/v1/stats", timeout=10)
            if resp.status_code != 200:  # 401: it needs its admin key (--replica-api-key)
                raise ValueError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            return list(resp.json()["models"])
        except (httpx.HTTPError, ValueError, KeyError) as e:
            raise RuntimeError(f"replica {url} does not answer GET /v1/stats: {e}") from e


async def _gather(starts: Sequence[Awaitable[EngineClient]]) -> list[EngineClient]:
    results = await asyncio.gather(*starts, return_exceptions=True)
    engines = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await _close_all(engines)
        raise errors[0]
    return engines


async def _close_all(engines: Sequence[EngineClient]) -> None:
    await asyncio.gather(*(e.close() for e in engines), return_exceptions=True)
