"""The load generator: streaming requests to an OpenAI-compatible server, open or closed loop.

- Open loop (`rate`): requests arrive at exponential (Poisson) or constant intervals whatever
  the server does, so a slow server builds a queue, as with real users.
- Closed loop (`concurrency`): N clients each send their next request when the previous ends.

A level ends when `num_requests` were sent or `duration` seconds passed, whichever comes first;
requests still in flight then get `drain_timeout` seconds to finish before being cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import httpx

from headrace.bench.client import Target, make_client, send
from headrace.bench.scrape import MetricsScraper, Snapshot
from headrace.bench.stats import RequestResult
from headrace.bench.workloads import RequestSpec, Workload


@dataclass
class Bounds:
    num_requests: int | None = 100
    duration: float | None = None  # seconds to keep sending
    drain_timeout: float = 60.0  # seconds for in-flight requests after sending stops


@dataclass
class LevelRun:
    mode: str  # "rate" or "concurrency"
    level: float
    started_at: float  # unix time
    duration_s: float
    results: list[RequestResult]
    metrics_available: bool = False
    timeline: list[Snapshot] = field(default_factory=list)
    generation_tokens_delta: float | None = None


OnResult = Callable[[RequestResult], None]


class _Collector:
    """Runs requests as tasks and keeps their results, cancelled ones included."""

    def __init__(self, client: aiohttp.ClientSession, target: Target, t0: float, on: OnResult):
        self.client, self.target, self.t0, self.on = client, target, t0, on
        self.results: list[RequestResult] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def one(self, spec: RequestSpec) -> None:
        try:
            result = await send(self.client, self.target, spec, self.t0)
        except asyncio.CancelledError:
            now = time.perf_counter() - self.t0
            result = RequestResult(
                index=spec.index,
                start=now,
                ok=False,
                error="cancelled",
                tenant=spec.tenant.name if spec.tenant else None,
                tier=spec.tenant.tier if spec.tenant else None,
                kind=spec.kind,
                max_tokens=spec.max_tokens,
            )
            self.results.append(result)
            raise
        self.results.append(result)
        self.on(result)

    def spawn(self, spec: RequestSpec) -> None:
        task = asyncio.create_task(self.one(spec))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self, timeout: float) -> None:
        pending = set(self.tasks)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


async def open_loop(
    col: _Collector, workload: Workload, rate: float, bounds: Bounds, arrivals: str, seed: int
) -> None:
    rng = random.Random(seed)
    offset = 0.0
    for i in itertools.count():
        if bounds.num_requests is not None and i >= bounds.num_requests:
            break
        if i > 0:
            offset += rng.expovariate(rate) if arrivals == "poisson" else 1.0 / rate
        if bounds.duration is not None and offset > bounds.duration:
            break
        delay = col.t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        col.spawn(workload.request(i))


async def closed_loop(
    col: _Collector, workload: Workload, concurrency: int, bounds: Bounds
) -> None:
    counter = itertools.count()

    async def worker() -> None:
        while True:
            i = next(counter)
            over_count = bounds.num_requests is not None and i >= bounds.num_requests
            elapsed = time.perf_counter() - col.t0
            if over_count or (bounds.duration is not None and elapsed >= bounds.duration):
                return
            await col.one(workload.request(i))

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    col.tasks.update(workers)
    for w in workers:
        w.add_done_callback(col.tasks.discard)
    deadline = None if bounds.duration is None else bounds.duration + bounds.drain_timeout
    _, pending = await asyncio.wait(workers, timeout=deadline)
    for w in pending:
        w.cancel()
    if pending:
        await asyncio.wait(pending)


async def run_level(
    target: Target,
    workload: Workload,
    mode: str,
    level: float,
    bounds: Bounds,
    *,
    arrivals: str = "poisson",
    scrape_interval: float | None = 0.5,
    on_result: OnResult | None = None,
) -> LevelRun:
    """One benchmark run at one offered load (`mode` "rate": requests/s; "concurrency")."""
    metrics_client = httpx.AsyncClient(base_url=target.url, timeout=10.0)
    async with make_client(target) as client, metrics_client:
        scraper = MetricsScraper(metrics_client, interval=scrape_interval or 0.5)
        if scrape_interval is not None:
            await scraper.start(time.perf_counter())
        started_at = time.time()
        t0 = time.perf_counter()
        stop = asyncio.Event()
        poller = asyncio.create_task(scraper.poll(t0, stop)) if scraper.available else None
        col = _Collector(client, target, t0, on_result or (lambda r: None))
        try:
            await _drive(col, workload, mode, level, bounds, arrivals)
            duration = time.perf_counter() - t0
        finally:
            stop.set()
            if poller is not None:
                await poller
        await scraper.finish(t0)
    return LevelRun(
        mode=mode,
        level=level,
        started_at=started_at,
        duration_s=duration,
        results=sorted(col.results, key=lambda r: r.index),
        metrics_available=scraper.available,
        timeline=scraper.timeline,
        generation_tokens_delta=scraper.generation_tokens_delta(),
    )


async def _drive(
    col: _Collector, workload: Workload, mode: str, level: float, bounds: Bounds, arrivals: str
) -> None:
    """Send the level's requests: open loop (then wait for the last), or closed loop."""
    if mode == "rate":
        await open_loop(col, workload, level, bounds, arrivals, workload.seed)
        await col.drain(bounds.drain_timeout)
    else:
        await closed_loop(col, workload, int(level), bounds)
