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
SENT_AT = 60  # the bystander's chunks before the guided request is sent
AFTER = 100  # chunks read after the guided request's answer


def test_the_first_guided_request_does_not_stall_a_bystander(tmp_path: Path) -> None:
    with running(ARGS, tmp_path) as server:
        times, (sent, done, guided) = _bystander_with_guided(server.url)
    assert guided.status_code == 200, guided.text
    assert guided.json()["choices"][0]["text"] in ("blue", "grey")
    pairs = list(zip(times[WARMUP:], times[WARMUP + 1 :], strict=False))
    during = [b - a for a, b in pairs if b > sent and a < done]  # gaps the request overlaps
    others = [b - a for a, b in pairs if not (b > sent and a < done)]
    median = statistics.median(others)
    worst = max(during)
    # Two steps would be 2x the median; the machine is shared, so allow 8x (the request's own
    # prefill joins a step), or the stream's own worst gap elsewhere twice over (other work on
    # the machine). Building the token table on the step took seconds.
    limit = max(8 * median, 0.4, 2 * max(others))
    print(f"bystander gaps: {worst:.3f} s at the guided request; elsewhere median {median:.3f} s")
    assert worst < limit, f"gap {worst:.3f} s, median {median:.3f} s, limit {limit:.3f} s"


def _bystander_with_guided(
    url: str,
) -> tuple[list[float], tuple[float, float, httpx.Response]]:
    """The arrival time of each of a stream's chunks, and the first guided request sent while
    it runs: (sent at, answered at, its response)."""
    times: list[float] = []
    result: list[tuple[float, float, httpx.Response]] = []

    def send() -> None:
        sent = time.perf_counter()
        r = httpx.post(url + "/v1/completions", json=GUIDED, timeout=120)
        result.append((sent, time.perf_counter(), r))

    sender = threading.Thread(target=send)
    answered_at: int | None = None  # chunks the stream had when the guided answer came
    with httpx.stream("POST", url + "/v1/completions", json=BYSTANDER, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            times.append(time.perf_counter())
            if len(times) == SENT_AT:
                sender.start()
            if result and answered_at is None:
                answered_at = len(times)
            if answered_at is not None and len(times) >= answered_at + AFTER:
                break
    sender.join(120)
    assert result, "the guided request did not complete"
    return times, result[0]
