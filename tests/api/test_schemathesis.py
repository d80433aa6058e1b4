"""Property-based requests generated from /openapi.json: no 5xx, every answer fits the schema."""

from __future__ import annotations

from typing import Any

import httpx
import hypothesis
import schemathesis
from factories import Server
from hypothesis import HealthCheck
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES_PER_ROUTE = 30
ROUTES = {
    "POST /v1/generate", "POST /v1/completions", "POST /v1/chat/completions",
    "GET /v1/models", "GET /health",
}  # fmt: skip
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def run_schemathesis(
    url: str,
    max_examples: int = EXAMPLES_PER_ROUTE,
    routes: set[str] | frozenset[str] = ROUTES,
    checks: list[Any] | None = None,
    headers: dict[str, str] | None = None,
    schema_headers: dict[str, str] | None = None,
) -> list[str]:
    """Run the `routes` of the server's schema (served with `--api-docs`, read with
    `schema_headers`: the admin key on a guarded server); returns those it exercised."""
    raw = httpx.get(url + "/openapi.json", headers=schema_headers, timeout=60)
    assert raw.status_code == 200, raw.text
    schema = schemathesis.openapi.from_dict(raw.json())
    seen = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label not in routes:  # other subsystems' routes have their own tests
            continue
        seen.append(operation.label)

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=max_examples, deadline=None, database=None, derandomize=True,
            suppress_health_check=list(HealthCheck), phases=[hypothesis.Phase.generate],
        )  # fmt: skip
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(
                base_url=url, checks=checks or CHECKS, headers=headers or {}, timeout=60
            )

        check()
    return seen


def test_generated_requests_find_no_server_error_or_schema_violation(api_server: Server) -> None:
    seen = run_schemathesis(api_server.url)
    assert set(seen) == ROUTES
