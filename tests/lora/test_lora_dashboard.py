"""The LoRA panel's numbers through a real `headrace serve` with two adapters: Prometheus's
per-model-name token counters equal the usage the clients were told, per adapter and for the
base; `lora_requests_info` and residency are exported; `/dashboard/data` gives the panel's
rows (the base model first) under the dashboard's own access rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from factories import Server, read_metrics, wait_for

from headrace.engine.messages import StepStats
from headrace.metrics.engine_collector import EngineCollector
from headrace.router.load import sum_stats
from lora.dashboard_server import ADAPTERS, ADMIN, BOB, lora_server, send_each


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from lora_server(tmp_path_factory.mktemp("lora-dashboard"))


def _panel(server: Server) -> list[dict[str, Any]]:
    r = httpx.get(server.url + "/dashboard/data", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["lora"]["tiny"]
    return rows


def test_token_counters_and_panel_equal_the_usage_told(server: Server) -> None:
    told = send_each(server.url)
    metrics = read_metrics(server.url, ADMIN)
    for model, (prompt, generated) in told.items():
        assert metrics[f'headrace:prompt_tokens_total{{model_name="{model}"}}'] == prompt
        assert metrics[f'headrace:generation_tokens_total{{model_name="{model}"}}'] == generated
    wait_for(lambda: all(r["running"] == 0 for r in _panel(server)), 10, "the requests to end")
    rows = {r["name"]: r for r in _panel(server)}
    assert list(rows) == ["tiny", "legal", "support"]  # the base first, then by name
    for model, usage in told.items():
        assert (rows[model]["prompt_tokens"], rows[model]["generation_tokens"]) == usage
        assert (rows[model]["running"], rows[model]["waiting"]) == (0, 0)
    assert rows["tiny"]["adapter"] is False and "resident" not in rows["tiny"]
    # --max-cpu-loras 1: the adapter served last holds the only place in memory.
    assert (rows["legal"]["resident"], rows["support"]["resident"]) == (1, 0)
    loads = sum(rows[a]["loads"] for a in ADAPTERS)
    evictions = sum(rows[a]["evictions"] for a in ADAPTERS)
    assert loads == metrics['headrace:lora_adapter_loads_total{model_name="tiny"}'] >= 3
    assert evictions == metrics['headrace:lora_adapter_evictions_total{model_name="tiny"}'] >= 2
    assert metrics['headrace:lora_adapter_resident{lora_name="legal",model_name="tiny"}'] == 1
    assert metrics['headrace:lora_adapter_resident{lora_name="support",model_name="tiny"}'] == 0
    for a in ADAPTERS:  # by adapter, as the panel shows them
        key = f'{{lora_name="{a}",model_name="tiny"}}'
        assert metrics[f"headrace:lora_adapter_reads_total{key}"] == rows[a]["loads"] >= 1
        assert metrics[f"headrace:lora_adapter_drops_total{key}"] == rows[a]["evictions"]


def test_lora_requests_info_names_max_lora(server: Server) -> None:
    metrics = read_metrics(server.url, ADMIN)
    info = [k for k in metrics if k.startswith("headrace:lora_requests_info{")]
    assert len(info) == 1 and 'max_lora="1"' in info[0] and 'model_name="tiny"' in info[0], info


def test_the_panel_keeps_the_dashboards_access_rule(server: Server) -> None:
    for headers in ({}, BOB):  # a tenant's key is not the admin key
        r = httpx.get(server.url + "/dashboard/data", headers=headers, timeout=10)
        assert r.status_code == 401 and "support" not in r.text


def test_adapter_rows_add_up_over_replicas_and_reach_prometheus() -> None:
    one = StepStats(max_loras=2, lora_requests=(("a", 1, 2, 10),),
                    lora_adapters=(("a", 1, 2, 1), ("b", 0, 1, 1)))  # fmt: skip
    two = StepStats(max_loras=2, lora_adapters=(("a", 1, 1, 0),))
    total = sum_stats([one, two])
    assert total.lora_adapters == (("a", 2, 3, 1), ("b", 0, 1, 1)) and total.max_loras == 2

    class Engine:
        def stats(self) -> StepStats:
            return total

    samples = {
        (m.name, tuple(s.labels.values())): s.value
        for m in EngineCollector(lambda: {"tiny": Engine()}).collect()  # type: ignore[dict-item]
        for s in m.samples
    }
    assert samples["headrace:lora_adapter_resident", ("tiny", "a")] == 2
    assert samples["headrace:lora_adapter_resident", ("tiny", "b")] == 0
    assert samples["headrace:lora_adapter_reads", ("tiny", "a")] == 3
    assert samples["headrace:lora_adapter_drops", ("tiny", "b")] == 1
    assert ("headrace:lora_requests_info", ("tiny", "a", "a", "2")) in samples
