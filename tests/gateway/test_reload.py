"""Reloading the gateway in process: keys and limits swap at once, requests in flight keep
their reservation, a bad file is refused and changes nothing, the admin key comes from one
source, and shared-limit leases follow the new limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.conftest import FakeClock, tenants_yaml
from headrace.config import GatewayConfig
from headrace.gateway.admin_key import AdminKeyError, AdminKeySource
from headrace.gateway.auth import hash_key
from headrace.gateway.errors import GatewayError
from headrace.gateway.gateway import TenantGateway
from headrace.gateway.reload import GatewayReloader
from headrace.gateway.shared_limits import SharedLimits
from headrace.gateway.tenants import TenantsFileError, load_tenants


def reloader(gw: TenantGateway, tenants_file: Path, key: Path | None = None) -> GatewayReloader:
    source = AdminKeySource("--admin-key-file", path=str(key)) if key else None
    return GatewayReloader(gw, str(tenants_file), source)


def test_keys_and_limits_swap_and_requests_in_flight_keep_theirs(
    tenants_file: Path, clock: FakeClock
) -> None:
    gw = TenantGateway.from_file(tenants_file, clock=clock)
    acme = gw.authenticate({"x-api-key": "acme-key"})
    held = gw.admit(acme, 100, 100)
    tenants_file.write_text(
        tenants_yaml(**{"max_concurrent: 2": "max_concurrent: 1", "tokens_per_minute: 6000":
                        "tokens_per_minute: 1000", "bob:": "robert:"})
    )  # fmt: skip
    result = reloader(gw, tenants_file).reload()
    assert result.status == 200, result.message
    assert result.summary["tenants_added"] == ["robert"]
    assert result.summary["tenants_removed"] == ["bob"]
    assert result.summary["tenants_changed"] == ["acme"]
    assert gw.authenticate({"x-api-key": "bob-key"}).name == "robert"
    with pytest.raises(GatewayError) as refused:
        gw.check(gw.authenticate({"x-api-key": "acme-key"}))  # 1 in flight, the limit is 1
    assert refused.value.status == 429 and "limit is 1" in refused.value.message
    limiter = gw.limiters["acme"]
    assert limiter.remaining() == 1000 - 200  # what was spent stays spent under the new limit
    gw.release(held, 150)
    assert limiter.in_flight == {} and limiter.remaining() == 1000 - 150
    gw.check(acme)


def test_a_revoked_key_is_refused_and_a_bad_file_changes_nothing(
    tenants_file: Path, clock: FakeClock
) -> None:
    gw = TenantGateway.from_file(tenants_file, clock=clock)
    good = tenants_file.read_text()
    tenants_file.write_text(good.replace("tokens_per_minute: 600", "tokens_per_minute: 0"))
    with pytest.raises(TenantsFileError) as at_start:
        load_tenants(tenants_file)
    result = reloader(gw, tenants_file).reload()
    assert (result.status, result.message) == (400, str(at_start.value))
    assert gw.authenticate({"x-api-key": "bob-key"}).name == "bob"
    tenants_file.write_text(tenants_yaml(**{hash_key("acme-key-2"): hash_key("acme-key-3")}))
    result = reloader(gw, tenants_file).reload()
    assert (result.summary["keys_added"], result.summary["keys_revoked"]) == (1, 1)
    assert gw.authenticate({"x-api-key": "acme-key-3"}).name == "acme"
    assert gw.authenticate({"x-api-key": "acme-key"}).name == "acme"
    with pytest.raises(GatewayError) as revoked:
        gw.authenticate({"x-api-key": "acme-key-2"})
    assert revoked.value.status == 401


def test_nothing_to_reload_without_a_file(clock: FakeClock) -> None:
    result = GatewayReloader(TenantGateway(None, clock=clock), None, None).reload()
    assert result.status == 409 and "nothing to reload" in result.message


def test_the_admin_key_file_is_read_again(tenants_file: Path, tmp_path: Path) -> None:
    key = tmp_path / "admin.key"
    key.write_text("first\n")
    gw = TenantGateway.from_file(tenants_file, admin_keys=["first"])
    key.write_text("second\n")
    assert reloader(gw, tenants_file, key).reload().ok
    assert gw.admin_keys.owner("second") == "admin" and gw.admin_keys.owner("first") is None
    key.write_text("")
    result = reloader(gw, tenants_file, key).reload()
    assert result.status == 400 and "admin key file is empty" in result.message
    assert gw.admin_keys.owner("second") == "admin"


def test_the_admin_key_has_one_source(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_text("  from-file \n")
    env = {"HEADRACE_ADMIN_KEY": "from-env"}
    assert AdminKeySource.resolve(GatewayConfig(), {}) is None
    assert AdminKeySource.resolve(GatewayConfig(), {"HEADRACE_ADMIN_KEY": ""}) is None
    from_env = AdminKeySource.resolve(GatewayConfig(), env)
    assert from_env is not None and from_env.read() == "from-env"
    from_file = AdminKeySource.resolve(GatewayConfig(admin_key_file=str(key)), {})
    assert from_file is not None and from_file.read() == "from-file"
    with pytest.raises(AdminKeyError, match="--admin-key, HEADRACE_ADMIN_KEY are all set"):
        AdminKeySource.resolve(GatewayConfig(admin_key="x"), env)
    missing = AdminKeySource("--admin-key-file", path=str(tmp_path / "none"))
    with pytest.raises(AdminKeyError, match="cannot read the admin key file"):
        missing.read()


def test_shared_limit_leases_follow_a_reload(tenants_file: Path, clock: FakeClock) -> None:
    gw = TenantGateway.from_file(tenants_file, clock=clock)
    shared = SharedLimits([])
    shared.refresh(gw)
    before = {lease.limiter.name: lease for lease in shared.leases}
    assert sorted(before) == ["acme", "bob"]  # the limited tenants
    tenants_file.write_text(
        tenants_yaml(**{"tokens_per_minute: 600\n": "tokens_per_minute: 900\n"}).replace(
            "    tokens_per_minute: 6000\n    max_concurrent: 2\n", ""
        )
    )
    assert reloader(gw, tenants_file).reload().ok
    shared.refresh(gw)
    after = {lease.limiter.name: lease for lease in shared.leases}
    assert sorted(after) == ["bob"]  # acme has no limits any more: its lease is dropped
    assert after["bob"] is not before["bob"] and after["bob"].capacity == 900
    assert gw.limiters["bob"].bucket is after["bob"]  # installed
