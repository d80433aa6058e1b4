"""What an open dashboard costs a saturated server: CPU time of the front-end process.

Starts `headrace serve --tenants` on 127.0.0.1 (Gemma 3 270M unless `--model`) and keeps it
saturated with a multi-tenant closed loop (paid, free, a flooding free tenant, batch). While the
load runs, phases of `--phase-s` seconds take turns, each measuring the front end's CPU seconds
(utime + stime of the server process itself; the engine core is a process of its own):

- `none`: nobody looks;
- `page`: the dashboard open in headless Chromium (Debian's, through Playwright), polling 1/s;
- `poll20`: a client fetching /dashboard/data 20 times a second, to resolve the cost of one
  poll above the noise: (poll20 - none) / (20 * seconds).

Chromium reaches for outside addresses by itself: run this inside a network namespace with only
loopback, as the browser tests do:

    unshare -n sh -c 'ip link set lo up && .venv/bin/python bench/dashboard_cost.py'

Prints JSON and writes it to bench/out/dashboard_cost.json. With `--screenshots DIR` it
measures nothing: it opens the page, shoots it idle, runs the load and shoots it again
(`dashboard-idle.png`, `dashboard-load.png`; the ones in docs/img/ come from here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from headrace.bench.local import free_port, wait_healthy
from headrace.gateway.auth import hash_key

ADMIN = "admin-secret"
MIX = (("acme", "paid", 4), ("calm", "free", 2), ("flood", "free", 16), ("nightly", "batch", 4))
OUT = Path(__file__).resolve().parent / "out"


def tenants_yaml() -> str:
    lines = [f"admin_key_sha256: [{hash_key(ADMIN)}]", "tenants:"]
    for name, tier, _ in MIX:
        limit = ", max_concurrent: 8" if name == "flood" else ""
        lines.append(f"  {name}: {{tier: {tier}, api_key_sha256: [{hash_key(name)}]{limit}}}")
    return "\n".join(lines) + "\n"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Background:
    """An async function of this object, run in a thread of its own until `stop()`."""

    def __init__(self, work: Callable[[Background], Any]) -> None:
        self.done = threading.Event()
        self.count = 0  # what the work counted (the poller: polls answered)
        self.thread = threading.Thread(target=lambda: asyncio.run(work(self)), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(60)


def load(url: str, max_tokens: int) -> Background:
    async def run(bg: Background) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def loop(tenant: str) -> None:
                body = {"prompt": f"{tenant}: tell me a story", "max_tokens": max_tokens}
                headers = {"authorization": f"Bearer {tenant}"}
                while not bg.done.is_set():
                    r = await client.post("/v1/generate", json=body, headers=headers)
                    if r.status_code != 200:
                        await asyncio.sleep(0.1)

            await asyncio.gather(*(loop(t) for t, _, n in MIX for _ in range(n)))

    return Background(run)


def poller(url: str, hz: float) -> Background:
    async def run(bg: Background) -> None:
        headers = {"authorization": f"Bearer {ADMIN}"}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
            while not bg.done.is_set():
                (await client.get("/dashboard/data")).raise_for_status()
                bg.count += 1
                await asyncio.sleep(1 / hz)

    return Background(run)


class Page:
    """The dashboard open in headless Chromium."""

    def __init__(self, url: str, height: int = 1000) -> None:
        from playwright.sync_api import sync_playwright

        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-background-networking"],
        )
        ctx = self.browser.new_context(
            http_credentials={"username": "admin", "password": ADMIN},
            viewport={"width": 1400, "height": height},
        )
        self.page = ctx.new_page()
        self.page.goto(url + "/dashboard")

    def stop(self) -> None:
        self.browser.close()
        self.pw.stop()


def phase(pid: int, seconds: float, start: Callable[[], Any] | None) -> tuple[float, float]:
    """The front end's CPU share of one core over `seconds` with `start()` running, and the
    rate at which what ran counted (polls per second for the poller)."""
    running = start() if start is not None else None
    time.sleep(1.0)  # let it settle (the page loads its files once)
    n0 = getattr(running, "count", 0)
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    time.sleep(seconds)
    took = time.monotonic() - t0
    share = (cpu_seconds(pid) - c0) / took
    rate = (getattr(running, "count", 0) - n0) / took
    if running is not None:
        running.stop()
    return share, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--phase-s", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-queued-requests", type=int, default=32)
    ap.add_argument("--screenshots", default=None, help="shoot the page into DIR, measure nothing")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tenants = Path(tmp) / "tenants.yaml"
        tenants.write_text(tenants_yaml())
        port = free_port()
        cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(port),
               "--tenants", str(tenants), "--max-num-seqs", str(args.max_num_seqs),
               "--max-queued-requests", str(args.max_queued_requests),
               "--log-level", "warning"]  # fmt: skip
        if args.model:
            cmd += ["--model", args.model]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc)
            if args.screenshots:
                shoot(url, Path(args.screenshots), args)
            else:
                print(json.dumps(measure(url, proc.pid, args), indent=2))
        finally:
            proc.terminate()
            proc.wait(30)


def measure(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    running = load(url, args.max_tokens)
    shares: dict[str, list[float]] = {"none": [], "page": [], "poll20": []}
    rates: list[float] = []
    try:
        time.sleep(3)  # the load reaches its steady state
        for _ in range(args.rounds):
            shares["none"].append(phase(pid, args.phase_s, None)[0])
            shares["page"].append(phase(pid, args.phase_s, lambda: Page(url))[0])
            share, rate = phase(pid, args.phase_s, lambda: poller(url, 20))
            shares["poll20"].append(share)
            rates.append(rate)
    finally:
        running.stop()
    med = {k: statistics.median(v) for k, v in shares.items()}
    per_poll = (med["poll20"] - med["none"]) / statistics.median(rates)
    doc = {
        "front_end_core_share": shares,
        "median": med,
        "polls_per_s": rates,
        "cpu_ms_per_poll": round(per_poll * 1000, 3),
        "page_cost_percent_of_core_at_1hz": round(per_poll * 100, 3),
        "page_minus_none_percent_of_core": round((med["page"] - med["none"]) * 100, 2),
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "dashboard_cost.json").write_text(json.dumps(doc, indent=2))
    return doc


def shoot(url: str, out: Path, args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    viewer = Page(url)
    try:
        viewer.page.wait_for_timeout(10_000)
        viewer.page.screenshot(path=str(out / "dashboard-idle.png"), full_page=True)
        running = load(url, args.max_tokens)
        try:
            viewer.page.wait_for_timeout(args.phase_s * 1000)
            viewer.page.screenshot(path=str(out / "dashboard-load.png"), full_page=True)
        finally:
            running.stop()
    finally:
        viewer.stop()


if __name__ == "__main__":
    main()
