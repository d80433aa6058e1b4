"""The ledger's health as Prometheus metrics, read at each scrape (`Metrics.add_collector`)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.ledger.writer import Ledger
from headrace.metrics.prometheus import PREFIX


class LedgerMetrics(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterable[Metric]:
        ledger = self.ledger
        yield CounterMetricFamily(
            PREFIX + "ledger_records_written", "Usage and audit records written to the ledger.",
            value=ledger.written,
        )  # fmt: skip
        yield CounterMetricFamily(
            PREFIX + "ledger_records_spilled",
            "Records past the memory bound put in the spill file while the ledger could not be "
            "written (written back when it can).",
            value=ledger.spilled,
        )  # fmt: skip
        yield CounterMetricFamily(
            PREFIX + "ledger_records_dropped",
            "Records lost: the ledger, and then the spill file, could not be written.",
            value=ledger.dropped,
        )  # fmt: skip
        yield CounterMetricFamily(
            PREFIX + "ledger_write_errors", "Failed attempts to write the ledger.",
            value=ledger.write_errors,
        )  # fmt: skip
        yield GaugeMetricFamily(
            PREFIX + "ledger_records_pending", "Records waiting to be written.",
            value=ledger.pending,
        )  # fmt: skip
