"""Scrape a server's Prometheus `/metrics` during a run: a timeline of batch size, queue depth
and KV-cache usage, and the generated-token counter before and after.

Headrace's names come first; vLLM's (`vllm:`) map over since Headrace names its metrics after
them. A server without such metrics (llama.cpp, TGI, a stub) gives no timeline, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx

PREFIXES = ("headrace:", "vllm:")
GAUGES = {
    "running": ("num_requests_running",),
    "waiting": ("num_requests_waiting",),
    "kv_cache_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
}
GENERATION_COUNTER = "generation_tokens_total"


def parse_metrics(text: str) -> dict[str, list[float]]:
    """Prometheus text format -> {sample name: values of all its label sets}."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "counter":  # declared but not counted yet (no label set): zero
            samples.setdefault(family.name + "_total", [])
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(float(sample.value))
    return samples


@dataclass
class Snapshot:
    t: float  # seconds since the run started
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    generation_tokens: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {
            "t": self.t,
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_cache_usage,
        }


def snapshot_from(samples: dict[str, list[float]], t: float) -> Snapshot:
    snap = Snapshot(t=t)
    for attr, names in GAUGES.items():
        values = _find(samples, names)
        if values is not None:
            # Several replicas or models: counts add up, a usage share averages.
            agg = sum(values) / len(values) if attr == "kv_cache_usage" else sum(values)
            setattr(snap, attr, agg)
    counter = _find(samples, (GENERATION_COUNTER,))
    snap.generation_tokens = sum(counter) if counter is not None else None
    return snap


def _find(samples: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    for prefix in PREFIXES:
        for name in names:
            if prefix + name in samples:
                return samples[prefix + name]
    return None


@dataclass
class MetricsScraper:
    """Polls `/metrics` every `interval` seconds until stopped; `available` is False when the
    server has no metrics we know."""

    client: httpx.AsyncClient
    interval: float = 0.5
    available: bool = False
    timeline: list[Snapshot] = field(default_factory=list)
    first: Snapshot | None = None
    last: Snapshot | None = None

    async def scrape(self, t0: float) -> Snapshot | None:
        try:
            resp = await self.client.get("/metrics", timeout=5.0)
            if resp.status_code != 200:
                return None
            snap = snapshot_from(parse_metrics(resp.text), time.perf_counter() - t0)
        except (httpx.HTTPError, ValueError):
            return None
        known = (snap.running, snap.waiting, snap.kv_cache_usage, snap.generation_tokens)
        return snap if any(v is not None for v in known) else None

    async def start(self, t0: float) -> None:
        self.first = await self.settled(t0)
        self.available = self.first is not None

    async def poll(self, t0: float, stop: asyncio.Event) -> None:
        """Run until `stop` is set; call only when `available`."""
        while not stop.is_set():
            snap = await self.scrape(t0)
            if snap is not None:
                self.timeline.append(snap)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)

    async def finish(self, t0: float) -> None:
        if self.available:
            self.last = await self.settled(t0)

    async def settled(self, t0: float, tries: int = 5) -> Snapshot | None:
        """A scrape once the token counter stopped moving: servers may count a request's
        tokens a moment after its stream ended (Headrace does when the response closes)."""
        snap = await self.scrape(t0)
        for _ in range(tries):
            if snap is None or snap.generation_tokens is None:
                break
            await asyncio.sleep(0.2)
            again = await self.scrape(t0)
            if again is None:
                break
            settled = again.generation_tokens == snap.generation_tokens
            snap = again
            if settled:
                break
        return snap

    def generation_tokens_delta(self) -> float | None:
        if self.first is None or self.last is None:
            return None
        if self.first.generation_tokens is None or self.last.generation_tokens is None:
            return None
        return self.last.generation_tokens - self.first.generation_tokens
