"""Every route the app mounts has an in-process test: a new route without one fails here.

The tests say what they cover with `@covers(...)` (api/route_coverage.py), which also checks
that they do send those routes a request; this compares the routes so covered, across the API
test modules that use it, with those `build_app` mounts.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from fake_engine import FakeEngine

from api.inprocess import make_app
from api.route_coverage import covered_routes, mounted_routes
from headrace.config import ServerConfig

HERE = Path(__file__).parent


def registered() -> set[str]:
    """The routes `@covers` names in the API test modules (imported here: run alone, this test
    must see them all the same)."""
    objects: list[object] = []
    for path in sorted(HERE.glob("test_*.py")):
        if "@covers(" in path.read_text():
            objects += vars(importlib.import_module(f"api.{path.stem}")).values()
    return covered_routes(objects)


def test_every_mounted_route_is_covered_in_process() -> None:
    every = ServerConfig(api_docs=True)  # the routes a flag adds too
    mounted = set(mounted_routes(make_app(FakeEngine(), config=every).routes))
    assert len(mounted) > 10, mounted  # the included routers were walked too
    covered = registered()
    assert not mounted - covered, f"routes without an in-process test: {mounted - covered}"
    assert not covered - mounted, f"tests cover routes the app no longer has: {covered - mounted}"
