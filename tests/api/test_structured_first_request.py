"""The first structured-output request does not stall the streams beside it: llguidance's
table of Gemma's 262k tokens (seconds, under the GIL) is built before the server is ready, not
on that request's step. Real Gemma 3 270M behind `headrace serve`."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest
from factories import running

pytestmark = pytest.mark.gemma

ARGS = [
    "--max-model-len", "1024", "--max-num-seqs", "8", "--num-speculative-tokens", "0",
    "--log-level", "warning",
]  # fmt: skip
BYSTANDER = {
    "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
    "stream": True,
}  # fmt: skip
GUIDED = {
    "prompt": "The sky is",
    "max_tokens": 8,
    "temperature": 0,
    "guided_choice": ["blue", "grey"],
}
WARMUP = 20  # chunks before the gaps count (first steps, the int8 head arriving)
SENT_AT = 60  # chunks of the bystander's before the guided request is sent


def test_the_first_guided_request_does_not_stall_a_bystander(tmp_path: Path) -> None:
    with running(ARGS, tmp_path) as server:
        times, guided = _bystander_with_guided(server.url)
    assert guided.status_code == 200, guided.text
    assert guided.json()["choices"][0]["text"] in ("blue", "grey")
    gaps = [b - a for a, b in zip(times[WARMUP:], times[WARMUP + 1 :], strict=False)]
    median = statistics.median(gaps)
    worst = max(gaps)
    # Two steps would be 2x the median; the machine is shared, so allow 8x (a step of its own
    # prefill joins too). The token table alone takes seconds.
    limit = max(8 * median, 0.4)
    print(f"bystander gaps: largest {worst:.3f} s, median {median:.3f} s")
    assert worst < limit, f"largest gap {worst:.3f} s, median {median:.3f} s, limit {limit:.3f} s"


def _bystander_with_guided(url: str) -> tuple[list[float], httpx.Response]:
    """The arrival time of each of a stream's chunks, the first guided request sent while it
    runs, and that request's response."""
    times: list[float] = []
    result: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: result.append(httpx.post(url + "/v1/completions", json=GUIDED, timeout=120))
    )
    with httpx.stream("POST", url + "/v1/completions", json=BYSTANDER, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            times.append(time.perf_counter())
            if len(times) == SENT_AT:
                sender.start()
            if result and len(times) >= SENT_AT + 60:
                break  # well past the guided request's end
    sender.join(120)
    assert result, "the guided request did not complete"
    return times, result[0]
