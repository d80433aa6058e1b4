"""What a hostile page or tenant meets at the door of a real `headrace serve` on 127.0.0.1:
DNS rebinding (a foreign Host: 421), a foreign browser Origin (403; CORS only for the origins
allowed), the model list and the API schema on a guarded server, and SLO targets the dashboard
data cannot write as JSON (400, not 500)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, serving, tiny_server_args, write_tenants

from headrace.gateway.auth import hash_key

ADMIN = "door-admin"
TENANT = "door-tenant"
TENANTS = f"""
tenants:
  acme: {{tier: free, api_key_sha256: [{hash_key(TENANT)}]}}
"""
APP_ORIGIN = "https://app.example.com"
EVIL = "evil.example"
GENERATE = {"prompt": "Hello there", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def plain(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The open loopback default: no flag."""
    yield from serving(tiny_server_args(api_model_dir), tmp_path_factory.mktemp("door-plain"))


@pytest.fixture(scope="module")
def keyed(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Tenants and an admin key, no other flag."""
    tmp = tmp_path_factory.mktemp("door-keyed")
    args = ["--tenants", str(write_tenants(tmp, TENANTS)), "--admin-key", ADMIN]
    yield from serving(tiny_server_args(api_model_dir) + args, tmp)


@pytest.fixture(scope="module")
def guarded(api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("door-guarded")
    args = tiny_server_args(api_model_dir) + [
        "--tenants", str(write_tenants(tmp, TENANTS)), "--admin-key", ADMIN, "--api-docs",
        "--allowed-hosts", "headrace.internal, .corp.example", "--allowed-origins", APP_ORIGIN,
    ]  # fmt: skip
    yield from serving(args, tmp)


def port(server: Server) -> str:
    return server.url.rsplit(":", 1)[1]


def get(server: Server, path: str, **headers: str) -> httpx.Response:
    return httpx.get(server.url + path, headers=headers, timeout=30)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error: dict[str, object] = r.json()["error"]
    assert error["code"] in (status, None) and error["message"]
    return error


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/metrics", "/dashboard/data"])
@pytest.mark.parametrize("host", [EVIL, f"{EVIL}:{{port}}", "localhost.evil.example"])
def test_a_foreign_host_is_refused_with_421(plain: Server, path: str, host: str) -> None:
    r = get(plain, path, host=host.format(port=port(plain)))
    assert error_of(r, 421)["type"] == "misdirected_request_error"
    assert "--allowed-hosts" in str(r.json()["error"]["message"])


def test_a_foreign_host_gets_no_generation_and_the_server_stays_up(plain: Server) -> None:
    r = httpx.post(plain.url + "/v1/generate", json=GENERATE, headers={"host": EVIL}, timeout=30)
    error_of(r, 421)
    assert get(plain, "/health").status_code == 200


LOOPBACK = ("localhost", "localhost:{port}", "LOCALHOST.:{port}", "127.0.0.1:{port}",
            "[::1]:{port}", "127.0.0.1", "10.1.2.3:{port}")  # fmt: skip


def test_only_loopback_names_and_addresses_are_answered(plain: Server) -> None:
    statuses = {
        host: get(plain, "/v1/models", host=host.format(port=port(plain))).status_code
        for host in (*LOOPBACK, EVIL)
    }
    assert statuses == {**dict.fromkeys(LOOPBACK, 200), EVIL: 421}


@pytest.mark.parametrize(
    ("host", "status"),
    [("headrace.internal", 200), ("headrace.internal:{port}", 200), ("corp.example", 200),
     ("api.corp.example:{port}", 200), ("localhost", 200), ("other.example", 421),
     ("corp.example.evil.example", 421), (EVIL, 421)],
)  # fmt: skip
def test_allowed_hosts_are_answered_and_no_other(guarded: Server, host: str, status: int) -> None:
    r = get(guarded, "/health", host=host.format(port=port(guarded)))
    assert r.status_code == status, r.text


def test_a_foreign_origin_is_refused_and_gets_no_cors_headers(plain: Server) -> None:
    origin = {"origin": f"https://{EVIL}"}
    r = httpx.post(plain.url + "/v1/generate", json=GENERATE, headers=origin, timeout=30)
    assert error_of(r, 403)["type"] == "permission_error"
    assert not any(k.startswith("access-control-") for k in r.headers)
    preflight = httpx.options(plain.url + "/v1/generate", timeout=30, headers={
        **origin, "access-control-request-method": "POST"})  # fmt: skip
    error_of(preflight, 403)
    assert not any(k.startswith("access-control-") for k in preflight.headers)
    r = get(plain, "/v1/models", origin="null")  # a sandboxed frame, a file:// page
    error_of(r, 403)
    # The server's own pages (the dashboard) may call it, with no CORS header either.
    r = httpx.post(plain.url + "/v1/generate", json=GENERATE, timeout=60,
                   headers={"origin": plain.url})  # fmt: skip
    assert r.status_code == 200, r.text
    assert not any(k.startswith("access-control-") for k in r.headers)


def test_an_allowed_origin_gets_cors_headers(guarded: Server) -> None:
    r = get(guarded, "/v1/models", origin=APP_ORIGIN, **bearer(TENANT))
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "retry-after" in r.headers["access-control-expose-headers"]
    preflight = httpx.options(guarded.url + "/v1/chat/completions", timeout=30, headers={
        "origin": APP_ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})  # fmt: skip
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    refused = get(guarded, "/v1/models", origin=f"https://{EVIL}", **bearer(TENANT))
    error_of(refused, 403)
    assert "access-control-allow-origin" not in refused.headers


def test_the_model_list_of_a_guarded_server_needs_a_key(keyed: Server) -> None:
    assert error_of(get(keyed, "/v1/models"), 401)["type"] == "authentication_error"
    assert error_of(get(keyed, "/v1/models", **bearer("wrong")), 401)
    for key in (TENANT, ADMIN):
        r = get(keyed, "/v1/models", **bearer(key))
        assert r.status_code == 200, r.text
        assert [m["id"] for m in r.json()["data"]] == ["tiny"]


@pytest.mark.parametrize("name", ["plain", "keyed"])
def test_no_schema_or_docs_page_by_default(name: str, request: pytest.FixtureRequest) -> None:
    server: Server = request.getfixturevalue(name)
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        assert get(server, path, **bearer(ADMIN)).status_code == 404, path


def test_api_docs_serve_the_schema_to_the_admin_only_and_no_page(guarded: Server) -> None:
    assert error_of(get(guarded, "/openapi.json"), 401)
    assert error_of(get(guarded, "/openapi.json", **bearer(TENANT)), 401)
    r = get(guarded, "/openapi.json", **bearer(ADMIN))
    assert r.status_code == 200 and "/v1/chat/completions" in r.json()["paths"]
    for path in ("/docs", "/redoc"):  # Swagger UI and ReDoc would load from a CDN
        page = get(guarded, path, **bearer(ADMIN))
        assert page.status_code == 404 and "http" not in page.text, page.text


@pytest.mark.parametrize("query", ["ttft_ms=inf", "tpot_ms=1e309", "ttft_ms=1e12", "tpot_ms=1e6"])
def test_dashboard_data_refuses_targets_it_cannot_use(plain: Server, query: str) -> None:
    r = get(plain, "/dashboard/data?" + query)
    assert error_of(r, 400)["type"] == "invalid_request_error"
    assert get(plain, "/dashboard/data?ttft_ms=500&tpot_ms=50").status_code == 200
    assert get(plain, "/health").status_code == 200
    assert "Traceback" not in plain.log()


@pytest.mark.parametrize("origins", ["null", "https://ok.example,null", "ok.example"])
def test_origins_that_would_open_the_door_are_refused_at_start(origins: str) -> None:
    from headrace.config import ServerConfig

    with pytest.raises(ValueError, match="allowed_origins"):
        ServerConfig(allowed_origins=origins)
