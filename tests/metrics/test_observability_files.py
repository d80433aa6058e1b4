"""docs/observability/ against a live scrape: every metric name that a Grafana panel's query or
the vLLM mapping table uses exists in a real `headrace serve --tenants` /metrics on 127.0.0.1
(after traffic from two tenants, a refusal and a rate limit), scraped the way the Prometheus
config says (bearer admin key)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from factories import Server, make_tiny_llama, start_server, tiny_server_args
from prometheus_client.parser import text_string_to_metric_families

from headrace.gateway.auth import hash_key

DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability"
NAME = re.compile(r"headrace:[A-Za-z0-9_:]+")
ADMIN = "admin-secret"
TENANTS = f"""
admin_key_sha256: [{hash_key(ADMIN)}]
tenants:
  acme: {{tier: paid, api_key_sha256: [{hash_key("acme-key")}]}}
  bob: {{tier: free, api_key_sha256: [{hash_key("bob-key")}], tokens_per_minute: 20}}
"""


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """The sample names of a scrape after some traffic."""
    tmp = tmp_path_factory.mktemp("observability")
    (tmp / "tenants.yaml").write_text(TENANTS)
    args = tiny_server_args(make_tiny_llama(tmp / "tiny")) + [
        "--tenants",
        str(tmp / "tenants.yaml"),
    ]
    server = start_server(args, tmp)
    try:
        server.wait_ready()
        traffic(server)
        yield scrape(server)
    finally:
        server.stop()


def traffic(server: Server) -> None:
    body = {"prompt": "Hello there", "max_tokens": 12}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        statuses = [
            c.post(
                "/v1/generate", json=body, headers={"authorization": f"Bearer {key}"}
            ).status_code
            for key in ("acme-key", "bob-key", "bob-key", "wrong")
        ]
    assert statuses == [200, 200, 429, 401]


def scrape(server: Server) -> set[str]:
    config = yaml.safe_load((DOCS / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["authorization"]["type"] == "Bearer"
    r = httpx.get(server.url + job["metrics_path"], headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    assert httpx.get(server.url + job["metrics_path"]).status_code == 401  # hence the key
    return {s.name for family in text_string_to_metric_families(r.text) for s in family.samples}


def panel_queries() -> list[tuple[str, str]]:
    board = json.loads((DOCS / "grafana-dashboard.json").read_text())
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def test_every_grafana_query_names_only_scraped_metrics(scraped: set[str]) -> None:
    queries = panel_queries()
    assert len(queries) >= 30
    missing = [
        (title, name) for title, expr in queries for name in NAME.findall(expr)
        if name not in scraped
    ]  # fmt: skip
    assert missing == []
    assert all(NAME.search(expr) for _, expr in queries)  # no query without a metric


def test_the_grafana_board_has_the_pages_panels() -> None:
    titles = " | ".join(title for title, _ in panel_queries()).lower()
    panels = ("running / waiting", "batch tokens", "kv blocks", "step time", "tokens / s",
              "refused", "ttft", "inter-token", "routed", "in rotation", "restarts")  # fmt: skip
    assert [p for p in panels if p not in titles] == []


def test_every_headrace_name_in_the_vllm_table_is_scraped(scraped: set[str]) -> None:
    text = (DOCS / "vllm-metrics.md").read_text()
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| `vllm:")]
    assert len(rows) >= 25
    mapped = [ours.strip().strip("`") for _, ours in rows if ours.strip() != "—"]
    assert all(name.startswith("headrace:") for name in mapped), mapped
    mentioned = set(NAME.findall(text))
    assert set(mapped) <= mentioned
    # A histogram's samples are NAME_bucket, NAME_sum and NAME_count.
    assert sorted(n for n in mentioned if n not in scraped and n + "_count" not in scraped) == []
