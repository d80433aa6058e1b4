"""`headrace bench` end to end, as a user runs it: a subprocess against the stub server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import matplotlib.image
import pytest
from factories import free_port

from headrace.bench.report import load_schema

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "headrace.cli", "bench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def load_valid(path: Path) -> dict:
    doc = json.loads(path.read_text())
    jsonschema.Draft202012Validator(load_schema()).validate(doc)
    return doc


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] >= 300 and image.shape[1] >= 500


def test_closed_loop_sweep_counts_every_token_and_writes_json_and_plots(stub_server, tmp_path):
    url, stub = stub_server(slots=2, token_delay=0.005)
    proc = bench(
        "--url",
        url,
        "--concurrency",
        "1,4",
        "--num-requests",
        "12",
        "--prompt-len",
        "16",
        "--output-len",
        "8",
        "--scrape-interval",
        "0.05",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "out tok/s" in proc.stdout and "4 streams" in proc.stdout
    doc = load_valid(tmp_path / "bench.json")
    assert doc["target"]["model"] == "stub-model"  # found through /v1/models
    assert [r["level"] for r in doc["runs"]] == [1, 4]
    for run in doc["runs"]:
        s = run["summary"]
        assert (s["requests"], s["completed"], s["failed"]) == (12, 12, 0)
        assert s["output_tokens"] == 12 * 8 == run["server"]["generation_tokens_delta"]
        assert s["tokens_from_usage"] == 12 and s["prompt_tokens"] == 12 * 3
        assert s["ttft_s"]["count"] == 12 and s["itl_s"]["count"] == 12 * 7
        assert s["ttft_s"]["p50"] <= s["ttft_s"]["p95"] <= s["ttft_s"]["p99"] <= s["e2e_s"]["max"]
        assert run["server"]["metrics_available"] and run["server"]["timeline"]
    # 4 streams on 2 slots: half of them queue, which the scraped timeline saw.
    assert max(p["waiting"] for p in doc["runs"][1]["server"]["timeline"]) >= 1
    assert stub.generated == 2 + 2 * 12 * 8  # the preflight request asked for 2 tokens
    for name in ("load_sweep.png", "latency_cdf.png", "server_timeline.png"):
        assert_png(tmp_path / name)


def test_open_loop_tenants_over_generate_without_metrics(stub_server, tmp_path):
    url, stub = stub_server(slots=4, token_delay=0.002, metrics=False)
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  - {name: acme, api_key: k-acme, tier: paid, share: 1}\n"
        "  - {name: flood, api_key: k-flood, tier: free, share: 3}\n"
    )
    out = tmp_path / "out"
    proc = bench(
        "--url",
        url,
        "--api",
        "generate",
        "--rate",
        "50",
        "--arrivals",
        "constant",
        "--num-requests",
        "24",
        "--workload",
        "uniform",
        "--prompt-len",
        "4:32",
        "--output-len",
        "2:6",
        "--tenants",
        str(tenants),
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    doc = load_valid(out / "bench.json")
    run = doc["runs"][0]
    assert run["server"] == {
        "metrics_available": False,
        "generation_tokens_delta": None,
        "timeline": [],
    }
    per_tenant = {name: s["requests"] for name, s in run["by_tenant"].items()}
    stub.keys["k-acme"] -= 1  # the preflight request goes out with the first tenant's key
    assert per_tenant == {"acme": stub.keys["k-acme"], "flood": stub.keys["k-flood"]}
    assert set(run["by_tier"]) == {"paid", "free"} and "per tier" in proc.stdout
    assert run["summary"]["output_tokens"] == sum(q["max_tokens"] for q in run["requests"])
    assert not (out / "server_timeline.png").exists() and not (out / "load_sweep.png").exists()
    assert_png(out / "latency_cdf.png")


def test_rejections_are_counted_by_status(stub_server, tmp_path):
    url, _ = stub_server(slots=1, token_delay=0.01, max_waiting=0)
    proc = bench(
        "--url",
        url,
        "--concurrency",
        "4",
        "--num-requests",
        "16",
        "--output-len",
        "5",
        "--out",
        str(tmp_path),
        "--no-plots",
    )
    assert proc.returncode == 0, proc.stderr
    s = load_valid(tmp_path / "bench.json")["runs"][0]["summary"]
    assert s["failed"] > 0 and s["completed"] > 0 and s["failed"] + s["completed"] == 16
    assert s["errors"] == {
        "by_status": {"429": s["failed"]},
        "by_type": {"rate_limit_error": s["failed"]},
    }
    assert s["goodput"]["share"] == pytest.approx(s["completed"] / 16)
    assert "errors at 4 streams: 429" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0"], "--rate values must be finite and > 0"),
        (["--rate", "-3"], "--rate values must be finite and > 0"),
        (["--rate", ","], "--rate needs at least one value"),
        (["--concurrency", "2,x"], "--concurrency takes numbers"),
        (["--num-requests", "0"], "give --num-requests or --duration"),
        (["--output-len", "9:3"], "output length range"),
    ],
)
def test_bad_flags_end_with_one_clear_line(args: list[str], message: str) -> None:
    proc = bench("--url", f"http://127.0.0.1:{free_port()}", *args)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("headrace bench: error: ") and message in proc.stderr


def test_unreachable_url_and_failing_server(stub_server) -> None:
    proc = bench("--url", f"http://127.0.0.1:{free_port()}", "--num-requests", "2")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "cannot reach http://127.0.0.1:" in proc.stderr and len(proc.stderr.splitlines()) == 1
    url, _ = stub_server(fail_status=500)
    proc = bench("--url", url, "--num-requests", "2")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "answered 500 (server_error): the stub is told to fail" in proc.stderr
    plan = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "plan", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plan.returncode != 0 and "Traceback" not in plan.stderr and "500" in plan.stderr
