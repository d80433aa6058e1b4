"""bench/gpu/device_bench.py, the one script a scarce GPU session runs, runs here too (tiny
shapes on the CPU), so it does not rot between sessions that have a device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_script_runs_on_the_cpu_and_reports_every_part(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    cmd = [sys.executable, "bench/gpu/device_bench.py", "--device", "cpu", "--quick"]
    subprocess.run(
        [*cmd, "--out", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=300
    )
    report = json.loads(out.read_text())
    for shape in ("gemma3-270m", "llama3-8b"):
        for level in report[shape]["levels"].values():
            assert level["step_ms"] > 0 and level["floor_ms"] > 0
            # the profiler's reading runs here too (no device kernels on the CPU: zero)
            assert "profile" not in level or level["profile"]["launches_per_step"] == 0
            ratio = level["step_ms"] / level["floor_ms"]
            assert abs(level["over_floor"] - ratio) <= 0.01 * ratio
    assert all(isinstance(v["profile"], dict) for v in report["llama3-8b"]["levels"].values())
    assert report["gemma3-270m_compiled"]["levels"]["1"]["step_ms"] > 0
    assert report["gemma3-270m_compiled"]["compiled"] is False  # the CPU never compiles
    for key, overlap in (("engine_gemma3-270m", False), ("engine_gemma3-270m_async", True)):
        engine = report[key]
        assert engine["async_scheduling"] is overlap
        assert set(engine["levels"]) == {"1", "4"}
        assert all(v["tokens_per_s"] > 0 for v in engine["levels"].values())
        assert engine["join"]["first_token_ms"] > 0
        assert engine["sampled"]["streams"] == 4 and engine["sampled"]["tokens_per_s"] > 0
    for level in ("rows1", "rows4"):  # top_p's two ways: timed, and their sets alike
        assert report["top_p"][level]["same_mass"] is True
        assert report["top_p"][level]["topk_ms"] > 0 and report["top_p"][level]["fixed_ms"] > 0


@pytest.mark.parametrize("overlap", [False, True])
def test_the_host_step_bench_it_runs_reports_each_part_within_the_step(overlap: bool) -> None:
    cmd = [sys.executable, "bench/host_step.py", "--streams", "1,8", "--prompt", "32"]
    cmd += ["--async-scheduling"] if overlap else []
    done = subprocess.run(
        [*cmd, "--output", "8"], cwd=ROOT, check=True, capture_output=True, timeout=120
    )
    report = json.loads(done.stdout)
    assert report["async_scheduling"] is overlap
    for streams in ("streams1", "streams8"):
        row = report[streams]
        assert row["steps"] > 0  # decode-only steps with every stream running were timed
        parts = row["schedule_us"] + row["inputs_us"] + row["update_us"]
        assert 0 < parts <= row["step_us"] * 1.05  # medians: each part is inside the step
