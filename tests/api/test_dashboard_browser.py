"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real
`headrace serve --tenants` on 127.0.0.1, both inside a private network namespace with only
loopback (the `netns` marker): the page loads with no console error and no request leaving
127.0.0.1, draws its charts, its numbers move while an overload mix runs, its ledger panel
lists what the ledger recorded, and without the admin key it shows nothing. Screenshots go to
bench/out/."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from factories import Server, make_tiny_llama, start_server, tiny_server_args

from api.dashboard_mix import ADMIN, Load, tenants_yaml

CHROMIUM = "/usr/bin/chromium"
OUT = Path(__file__).resolve().parents[2] / "bench" / "out"
# Chromium's own background traffic off; the namespace stops whatever is left.
BROWSER_ARGS = [
    "--no-sandbox", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-default-apps",
]  # fmt: skip

pytestmark = pytest.mark.netns


def browser_problem() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if not Path(CHROMIUM).exists():
        return f"no {CHROMIUM}: `apt-get install chromium` (make test does so as root)"
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    problem = browser_problem()
    if problem is not None:
        pytest.skip(problem)
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "tenants.yaml").write_text(tenants_yaml())
    args = tiny_server_args(make_tiny_llama(tmp / "tiny-llama")) + [
        "--tenants", str(tmp / "tenants.yaml"), "--max-num-seqs", "4",
        "--max-queued-requests", "6",
    ]  # fmt: skip
    srv = start_server(args, tmp)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def chromium() -> Iterator[Any]:
    """A headless Chromium for a module's tests (its `browser` fixture yields from this)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    yield from chromium()


class Watched:
    """A page with every request and console message recorded."""

    def __init__(self, browser: Any, **context: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000}, **context)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.console: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self._console(m.type, m.text))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def _console(self, kind: str, text: str) -> None:
        if kind in ("error", "warning"):
            self.console.append(f"{kind}: {text}")

    def series(self, chart: str) -> list[list[float | None]]:
        data: list[list[float | None]] = self.page.evaluate(f"charts[{chart!r}].data.slice(1)")
        return data

    def table(self, selector: str) -> list[list[str]]:
        rows: list[list[str]] = self.page.eval_on_selector_all(
            f"{selector} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.innerText))"
        )
        return rows


def latest(series: list[list[float | None]]) -> list[float]:
    return [s[-1] or 0.0 for s in series if s]


def test_dashboard_live_under_an_overload_mix(server: Server, browser: Any) -> None:
    watched = Watched(browser, http_credentials={"username": "admin", "password": ADMIN})
    page = watched.page
    assert page.goto(server.url + "/dashboard").status == 200
    page.wait_for_function("document.getElementById('updated').textContent !== ''")
    page.wait_for_timeout(1500)  # a few polls: rates need two
    OUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT / "dashboard-idle.png"), full_page=True)
    assert page.locator(".uplot canvas").count() >= 13
    assert max(latest(watched.series("tps")), default=0) == 0  # nothing runs yet

    load = Load(server.url).start()
    try:
        seen = watch_under_load(watched)
        page.screenshot(path=str(OUT / "dashboard-load.png"), full_page=True)
    finally:
        load.stop()
    assert load.statuses[200] > 0, load.statuses
    assert max(seen["tokens_per_s"]) > 0
    assert max(seen["running"]) > 0
    assert len(set(seen["admitted"])) >= 3, seen["admitted"]  # it moved, poll after poll
    tenants = {row[0]: row for row in watched.table("#tenants")}
    assert {"acme", "calm", "flood", "nightly"} <= set(tenants), tenants
    if load.statuses[429] + load.statuses[503] > 0:
        assert tenants["flood"][3] != "0", tenants["flood"]  # its refusals, by reason
    replicas = watched.table("#replicas")
    assert replicas[0][:3] == ["tiny", "tiny/0", "healthy"], replicas
    page.evaluate("refreshLedger()")  # the ledger panel polls every 30 s: read it now
    ledger = {row[0]: row for row in watched.table("#ledger")}
    assert {"acme", "calm", "flood", "nightly"} <= set(ledger), ledger  # from the ledger
    recorded = sum(int(r[1]) for r in ledger.values())
    assert recorded >= load.statuses[200], (ledger, load.statuses)  # every answered request
    assert all(r[3] == "–" or r[3].endswith("%") for r in ledger.values()), ledger
    assert page.locator("#c-ledger .uplot canvas").count() == 1
    page.screenshot(path=str(OUT / "dashboard-ledger.png"), full_page=True)

    assert watched.console == [], watched.console
    assert watched.requests, "no request recorded"
    outside = [u for u in watched.requests if urlsplit(u).hostname != "127.0.0.1"]
    assert outside == [], outside
    watched.context.close()


def watch_under_load(watched: Watched, seconds: float = 8.0) -> dict[str, list[float]]:
    """What the page shows, read once a second while the load runs."""
    seen: dict[str, list[float]] = {"tokens_per_s": [], "running": [], "admitted": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watched.page.wait_for_timeout(1000)
        seen["tokens_per_s"].append(max(latest(watched.series("tps")), default=0))
        seen["running"].append(latest(watched.series("requests"))[0])
        rows = watched.table("#tenants")
        seen["admitted"].append(sum(float(r[2]) for r in rows if r[2] not in ("–", "")))
    return seen


def test_without_the_admin_key_the_page_shows_nothing(server: Server, browser: Any) -> None:
    for credentials in (None, {"username": "admin", "password": "wrong"}):
        watched = Watched(browser, http_credentials=credentials)
        assert navigation_refused(watched, server.url + "/dashboard")
        assert watched.page.locator(".uplot").count() == 0
        for path in ("/dashboard", "/dashboard/data", "/dashboard/static/dashboard.js"):
            response = watched.page.request.get(server.url + path)
            assert response.status == 401, path
            assert response.headers["www-authenticate"].startswith("Basic"), path
            assert "tiny" not in response.text()
        watched.context.close()


def navigation_refused(watched: Watched, url: str) -> bool:
    """Whether the browser was refused the page: shown the 401, or (Playwright's auth handler
    answering the challenge with no or wrong credentials) the navigation failed on it."""
    from playwright.sync_api import Error

    try:
        response = watched.page.goto(url)
    except Error as e:
        return "ERR_INVALID_AUTH_CREDENTIALS" in str(e)
    return response is not None and response.status == 401
