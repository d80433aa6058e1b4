"""Every route of the schema fuzzed, the internal ones (replica API, stats) included, on a server
with tenants and an admin key: with the admin key, with a tenant's key and with none. No 5xx,
no engine restart, the server healthy after, no KV blocks left in use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args, write_tenants
from schemathesis.checks import not_a_server_error

from api.test_schemathesis import run_schemathesis
from headrace.gateway.auth import hash_key

ADMIN = "fuzz-admin"
TENANT = "fuzz-tenant"
TENANTS = f"""
admin_key_sha256: [{hash_key(ADMIN)}]
tenants:
  fuzzer: {{tier: free, api_key_sha256: [{hash_key(TENANT)}]}}
"""
EXAMPLES = 15
EVERY_ROUTE = {
    "POST /v1/generate", "POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses",
    "GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}",
    "GET /v1/models", "GET /health", "GET /v1/stats", "POST /v1/replica/generate",
    "POST /v1/replica/abort", "GET /v1/replica/tokenizer", "GET /v1/usage", "GET /v1/audit",
    "POST /v1/files", "GET /v1/files", "GET /v1/files/{file_id}",
    "GET /v1/files/{file_id}/content", "DELETE /v1/files/{file_id}", "POST /v1/batches",
    "GET /v1/batches", "GET /v1/batches/{batch_id}", "POST /v1/batches/{batch_id}/cancel",
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    tenants = write_tenants(tmp, TENANTS)
    args = tiny_server_args(make_tiny_llama(tmp / "tiny"))
    args += ["--tenants", str(tenants), "--api-docs"]
    yield from serving(args, tmp)


def _admin_stats(server: Server) -> dict[str, object]:
    r = httpx.get(server.url + "/health", headers={"x-api-key": ADMIN}, timeout=10)
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def _fuzz(url: str, key: str | None) -> set[str]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    admin = {"authorization": f"Bearer {ADMIN}"}  # /openapi.json is the admin's
    seen = run_schemathesis(url, EXAMPLES, EVERY_ROUTE, [not_a_server_error], headers, admin)
    return set(seen)


@pytest.mark.parametrize("key", [ADMIN, TENANT, None], ids=["admin", "tenant", "no-key"])
def test_fuzzing_every_route_finds_no_server_error(server: Server, key: str | None) -> None:
    pid_before = server.proc.pid
    assert _fuzz(server.url, key) == EVERY_ROUTE
    assert server.proc.poll() is None and server.proc.pid == pid_before
    health = _admin_stats(server)
    assert health["status"] == "ok", health
    metrics = httpx.get(server.url + "/metrics", headers={"x-api-key": ADMIN}, timeout=10).text
    used = [line for line in metrics.splitlines() if line.startswith("headrace:kv_cache_used")]
    running = [ln for ln in metrics.splitlines() if ln.startswith("headrace:num_requests_running")]
    assert used and all(float(line.rsplit(" ", 1)[1]) == 0 for line in used), used
    assert running and all(float(line.rsplit(" ", 1)[1]) == 0 for line in running), running
    # The engine core is the same process: no restart happened.
    stats = httpx.get(server.url + "/v1/stats", headers={"x-api-key": ADMIN}, timeout=10).json()
    assert all(m["healthy"] for m in stats["models"].values()), stats
