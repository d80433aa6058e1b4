"""`headrace bench` against a real `headrace serve` (a tiny random-weight Llama made here): the
output tokens the bench counts equal the server's own `headrace:generation_tokens_total` delta."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from factories import make_tiny_llama, start_server, tiny_server_args

from headrace.bench.report import load_schema
from headrace.bench.scrape import parse_metrics


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("bench-serve")
    server = start_server(tiny_server_args(make_tiny_llama(base / "tiny")), base)
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


def generated_tokens(url: str) -> float:
    samples = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    return sum(samples.get("headrace:generation_tokens_total", []))


def test_bench_counts_the_tokens_the_server_generated(server_url: str, tmp_path: Path) -> None:
    before = generated_tokens(server_url)
    runs = []
    for api in ("completions", "generate"):
        out = tmp_path / api
        cmd = [
            sys.executable,
            "-m",
            "headrace.cli",
            "bench",
            "--url",
            server_url,
            "--api",
            api,
            "--concurrency",
            "1,4",
            "--num-requests",
            "8",
            "--workload",
            "uniform",
            "--prompt-len",
            "8:40",
            "--output-len",
            "4:16",
            "--scrape-interval",
            "0.1",
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads((out / "bench.json").read_text())
        jsonschema.Draft202012Validator(load_schema()).validate(doc)
        assert doc["target"]["ignore_eos"] is True  # Headrace takes it: exact output lengths
        runs += doc["runs"]
        for name in ("load_sweep.png", "latency_cdf.png", "server_timeline.png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    after = generated_tokens(server_url)
    counted = 0
    for run in runs:
        s = run["summary"]
        assert s["completed"] == 8 and s["tokens_from_usage"] == 8
        assert s["output_tokens"] == sum(q["max_tokens"] for q in run["requests"])
        assert s["output_tokens"] == run["server"]["generation_tokens_delta"]
        assert run["server"]["timeline"]
        counted += s["output_tokens"]
    assert after - before == counted + 2 * 2  # + each bench's 2-token preflight request
