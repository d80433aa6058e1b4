"""Router metrics, read live from the routers at each scrape (registered on the app's
`Metrics` with `add_collector`): requests routed per replica, replica health and state,
restarts, retries, resumes and each replica's load as the router sees it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.metrics.prometheus import PREFIX
from headrace.router.replica import ReplicaState
from headrace.router.router import Router


class RouterMetrics(Collector):
    def __init__(self, engines: Callable[[], Mapping[str, object]]) -> None:
        self.engines = engines

    def describe(self) -> Iterable[Metric]:
        return []  # the label sets follow the live routers

    def collect(self) -> Iterable[Metric]:
        routed, restarts, up, state, load = _replica_families()
        retries, resumes = _router_families()
        for name, engine in list(self.engines().items()):
            if not isinstance(engine, Router):
                continue
            retries.add_metric([name], engine.retries)
            resumes.add_metric([name], engine.resumes)
            for r in engine.replicas:
                key = [name, r.name]
                r.observe()
                routed.add_metric(key, r.routed)
                restarts.add_metric(key, r.restarts)
                up.add_metric(key, 1.0 if r.serving else 0.0)
                load.add_metric(key, r.load.load_tokens)
                for s in ReplicaState:
                    state.add_metric([*key, str(s)], 1.0 if r.state is s else 0.0)
        return [routed, restarts, up, state, load, retries, resumes]


_ReplicaFamilies = tuple[
    CounterMetricFamily,
    CounterMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
]


def _replica_families() -> _ReplicaFamilies:
    """Routed, restarts, healthy, state and load: labelled by model and replica."""
    labels = ["model_name", "replica"]
    routed = CounterMetricFamily(
        PREFIX + "router_requests_routed", "Requests sent to a replica (retries count).",
        labels=labels,
    )  # fmt: skip
    restarts = CounterMetricFamily(
        PREFIX + "router_replica_restarts", "Replica restarts after a failure.", labels=labels
    )
    up = GaugeMetricFamily(
        PREFIX + "router_replica_healthy", "1 while the replica is in rotation.", labels=labels
    )
    state = GaugeMetricFamily(
        PREFIX + "router_replica_state", "1 for the replica's current state.",
        labels=[*labels, "state"],
    )  # fmt: skip
    load = GaugeMetricFamily(
        PREFIX + "router_replica_load_tokens",
        "Waiting + running tokens reported, plus those dispatched since.", labels=labels,
    )  # fmt: skip
    return routed, restarts, up, state, load


def _router_families() -> tuple[CounterMetricFamily, CounterMetricFamily]:
    """Retries and resumes: labelled by model."""
    retries = CounterMetricFamily(
        PREFIX + "router_retries", "Requests sent again after their replica failed.",
        labels=["model_name"],
    )  # fmt: skip
    resumes = CounterMetricFamily(
        PREFIX + "router_resumes", "Streams continued elsewhere after their replica failed.",
        labels=["model_name"],
    )  # fmt: skip
    return retries, resumes
