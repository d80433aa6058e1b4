"""Which routes the in-process tests exercise, so that a route without a test fails
(`test_inprocess_routes.py`).

A test says which routes it covers with `@covers("POST /v1/generate", ...)`; the decorator
checks, after the test, that it did send each of them a request through an in-process app
(`record_hits` sees every request those apps get) — a parametrized test, one of them per case
(the cases share the routes out).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

F = TypeVar("F", bound=Callable[..., Any])
_hits: list[tuple[str, str]] = []  # (method, path) of every in-process request, in order


def record_hits(app: ASGIApp) -> ASGIApp:
    async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            _hits.append((scope["method"], scope["path"]))
        await app(scope, receive, send)

    return recorded


def covers(*routes: str) -> Callable[[F], F]:
    """Mark a test as covering `routes` ("METHOD /path/{param}"), and check that it does."""

    def mark(test: F) -> F:
        @functools.wraps(test)
        def checked(*args: Any, **kwargs: Any) -> Any:
            start = len(_hits)
            result = test(*args, **kwargs)
            sent = _hits[start:]
            hit = [r for r in routes if any(_matches(r, h) for h in sent)]
            if not _parametrized(test):
                missed = [r for r in routes if r not in hit]
                assert not missed, f"{test.__name__} covers {missed} but sent them no request"
            assert hit, f"{test.__name__} covers {list(routes)} but sent them no request"
            return result

        checked.covered_routes = routes  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return mark


def _parametrized(test: Callable[..., Any]) -> bool:
    return any(m.name == "parametrize" for m in getattr(test, "pytestmark", []))


def covered_routes(objects: Sequence[object]) -> set[str]:
    return {route for obj in objects for route in getattr(obj, "covered_routes", ())}


def mounted_routes(routes: Sequence[BaseRoute]) -> Iterator[str]:
    """ "METHOD /path" for every route an app mounts (HEAD, which Starlette adds to GET, left
    out). FastAPI keeps an included router as one entry: its routes are walked too."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if callable(contexts):
            for context in contexts():
                yield from _labels(context.path, context.original_route)
        else:
            yield from _labels(getattr(route, "path", ""), route)


def _labels(path: str, route: object) -> Iterator[str]:
    methods = getattr(route, "methods", None)
    assert path and methods, f"a route of an unknown kind: {route!r}"
    for method in sorted(set(methods) - {"HEAD"}):
        yield f"{method} {path}"


def _matches(route: str, hit: tuple[str, str]) -> bool:
    method, template = route.split(" ", 1)
    pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
    return hit[0] == method and re.fullmatch(pattern, hit[1]) is not None
