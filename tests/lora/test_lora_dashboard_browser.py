"""The dashboard's LoRA panel in a real headless Chromium (as tests/api/test_dashboard_browser.py,
inside a private network namespace with only loopback): after a request to the base and to
each adapter, the panel lists the base model and both adapters with the tokens the clients
were told, and which adapter's weights are in memory. Screenshot: bench/out/dashboard-lora.png."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from api.test_dashboard_browser import OUT, Watched, browser_problem, chromium
from factories import Server

from lora.dashboard_server import lora_server, send_each

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    problem = browser_problem()
    if problem is not None:
        pytest.skip(problem)
    yield from lora_server(tmp_path_factory.mktemp("lora-dashboard-browser"))


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    yield from chromium()


def test_the_lora_panel_lists_both_adapters(server: Server, browser: Any) -> None:
    told = send_each(server.url)
    watched = Watched(browser, http_credentials={"username": "admin", "password": "admin"})
    page = watched.page
    assert page.goto(server.url + "/dashboard").status == 200
    page.wait_for_function("document.querySelectorAll('#loras tbody tr').length >= 3")
    rows = {r[1]: r for r in watched.table("#loras")}
    assert set(rows) == {"tiny (base)", "support", "legal"}, rows
    for name, (prompt, generated) in told.items():
        shown = rows["tiny (base)" if name == "tiny" else name]
        assert shown[0] == "tiny" and (shown[2], shown[3]) == ("0", "0"), shown
        assert (shown[4], shown[6]) == (str(prompt), str(generated)), shown
    assert (rows["legal"][8], rows["support"][8]) == ("resident", "on disk"), rows
    assert int(rows["support"][9]) >= 1 and int(rows["support"][10]) >= 1, rows  # read, evicted
    OUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT / "dashboard-lora.png"), full_page=True)
    assert watched.console == [], watched.console
    outside = [u for u in watched.requests if urlsplit(u).hostname != "127.0.0.1"]
    assert watched.requests and outside == [], outside
    watched.context.close()
