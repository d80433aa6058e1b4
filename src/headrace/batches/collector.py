"""The batch runner's state as Prometheus metrics, read at each scrape (`Metrics.add_collector`)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.batches.runner import BatchRunner
from headrace.metrics.prometheus import PREFIX


class BatchMetrics(Collector):
    def __init__(self, runner: BatchRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterable[Metric]:
        runner = self.runner
        yield GaugeMetricFamily(
            PREFIX + "batches_running", "Batches whose lines this server is running.",
            value=len(runner.tasks),
        )  # fmt: skip
        yield GaugeMetricFamily(
            PREFIX + "batch_lines_running", "Batch lines in flight (at most --batch-concurrency).",
            value=runner.lines_running,
        )  # fmt: skip
        done = CounterMetricFamily(
            PREFIX + "batch_lines", "Batch lines finished, by outcome (completed: a 2xx).",
            labels=["outcome"],
        )  # fmt: skip
        for outcome, count in runner.lines_done.items():
            done.add_metric([outcome], count)
        yield done
