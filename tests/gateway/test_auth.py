from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

from headrace.gateway import auth
from headrace.gateway.auth import KeyStore, hash_key, key_from_headers
from headrace.gateway.errors import GatewayError
from headrace.gateway.gateway import TenantGateway


def test_hash_matches_the_documented_one_liner() -> None:
    assert hash_key("sk-abc") == hashlib.sha256(b"sk-abc").hexdigest()


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"Authorization": "Bearer sk-1"}, "sk-1"),
        ({"authorization": "bearer   sk-1 "}, "sk-1"),
        ({"X-API-Key": "sk-2"}, "sk-2"),
        ({"authorization": "Basic abc", "x-api-key": "sk-3"}, "sk-3"),
        ({"authorization": "Bearer "}, None),
        ({"authorization": "sk-1"}, None),
        ({}, None),
    ],
)
def test_key_from_headers(headers: dict[str, str], key: str | None) -> None:
    assert key_from_headers(headers) == key


def test_every_stored_digest_is_compared_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = KeyStore([(hash_key(f"k{i}"), f"t{i}") for i in range(5)])
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    for key, owner in [("k0", "t0"), ("k4", "t4"), ("nope", None)]:
        calls.clear()
        assert store.owner(key) == owner
        # No early exit whether the match is first, last or absent; equal-length digests.
        assert len(calls) == 5
        assert all(len(a) == len(b) == 32 for a, b in calls)
    calls.clear()
    assert store.owner(None) is None


def test_gateway_authentication(tenants_file: Path) -> None:
    gw = TenantGateway.from_file(tenants_file)
    assert gw.authenticate({"authorization": "Bearer acme-key"}).name == "acme"
    assert gw.authenticate({"x-api-key": "acme-key-2"}).tier == "paid"
    assert gw.authenticate({"x-api-key": "crunch-key"}).priority == 2
    for headers, words in [
        ({}, "missing API key"),
        ({"authorization": "Bearer wrong"}, "invalid API key"),
        ({"x-api-key": hash_key("acme-key")}, "invalid API key"),  # the digest is not the key
        ({"authorization": "Bearer admin-key"}, "invalid API key"),  # admin is not a tenant
    ]:
        with pytest.raises(GatewayError) as e:
            gw.authenticate(headers)
        assert (e.value.status, e.value.error_type) == (401, "authentication_error")
        assert words in e.value.message
        assert e.value.headers["www-authenticate"] == "Bearer"
    rejected = gw.metrics.rejected.labels("unauthenticated", "", "auth")._value.get()
    assert rejected == 4


def test_admin_key_protects_metrics(tenants_file: Path) -> None:
    gw = TenantGateway.from_file(tenants_file, admin_keys=["cli-admin"])
    assert gw.protects_metrics
    gw.authorize_admin({"authorization": "Bearer admin-key"})
    gw.authorize_admin({"x-api-key": "cli-admin"})
    for headers in ({}, {"authorization": "Bearer acme-key"}):
        with pytest.raises(GatewayError) as e:
            gw.authorize_admin(headers)
        assert e.value.status == 401
    open_gw = TenantGateway(None)
    assert not open_gw.protects_metrics
    open_gw.authorize_admin({})
    assert open_gw.authenticate({}).name == "default"
