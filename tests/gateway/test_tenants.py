from __future__ import annotations

from pathlib import Path

import pytest

from headrace.gateway.auth import hash_key
from headrace.gateway.tenants import TenantsFileError, load_tenants, parse_tenants


def test_yaml_file_resolves_tiers_and_overrides(tenants_file: Path) -> None:
    cfg = load_tenants(tenants_file)
    by_name = {t.name: t for t in cfg.tenants}
    assert set(by_name) == {"acme", "bob", "carol", "crunch"}
    acme = by_name["acme"]
    assert (acme.tier, acme.priority, acme.queue_timeout_s) == ("paid", 0, 5.0)
    assert acme.key_hashes == (hash_key("acme-key"), hash_key("acme-key-2"))
    assert (acme.tokens_per_minute, acme.max_concurrent) == (6000, 2)
    carol = by_name["carol"]  # no tier: free; weight overridden; one key as a bare string
    assert (carol.tier, carol.priority, carol.weight) == ("free", 1, 2.0)
    assert carol.tokens_per_minute is None
    crunch = by_name["crunch"]
    assert (crunch.priority, crunch.queue_timeout_s) == (2, 60.0)
    assert cfg.admin_key_hashes == (hash_key("admin-key"),)
    assert crunch.tenant().priority == 2 and crunch.tenant().name == "crunch"


def test_toml_file_with_a_custom_tier(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        f"""
[tiers.gold]
priority = 0
weight = 3
queue_timeout_s = 2.5

[tiers.batch]
queue_timeout_s = 300

[tenants.bigco]
tier = "gold"
api_key_sha256 = ["{hash_key("k1")}"]
max_concurrent = 4

[tenants.nightly]
tier = "batch"
api_key_sha256 = ["{hash_key("k2").upper()}"]
"""
    )
    cfg = load_tenants(path)
    bigco, nightly = cfg.tenants
    assert (bigco.priority, bigco.weight, bigco.queue_timeout_s) == (0, 3.0, 2.5)
    assert bigco.max_concurrent == 4
    assert (nightly.priority, nightly.queue_timeout_s) == (2, 300.0)
    assert nightly.key_hashes == (hash_key("k2"),)  # normalised to lower case
    assert set(cfg.tiers) == {"paid", "free", "batch", "gold"}


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("tier: paid", "tier: gold", "tenants.acme.tier"),
        ("tokens_per_minute: 6000", "tokens_per_minute: -5", "tenants.acme.tokens_per_minute"),
        ("tokens_per_minute: 6000", "tokens_per_minute: lots", "tenants.acme.tokens_per_minute"),
        ("max_concurrent: 2", "max_concurrent: 0", "tenants.acme.max_concurrent"),
        ("max_concurrent: 2", "max_concurent: 2", "tenants.acme.max_concurent"),
        ("weight: 2", "weight: 0", "tenants.carol.weight"),
        ("weight: 2", "queue_timeout_s: -1", "tenants.carol.queue_timeout_s"),
        ("weight: 2", "priority: 11", "tenants.carol.priority"),
        ("weight: 2", "cache_group: 7", "tenants.carol.cache_group"),
        ("weight: 2", "cache_group: ' '", "tenants.carol.cache_group"),
        ("weight: 2", "adapters: support", "tenants.carol.adapters"),
        ("weight: 2", "adapters: [support, 7]", "tenants.carol.adapters"),
        ("weight: 2", "adapters: ['']", "tenants.carol.adapters"),
        (hash_key("bob-key"), "sk-plain-text-key", "tenants.bob.api_key_sha256[0]"),
        (hash_key("bob-key"), hash_key("acme-key"), "tenants.bob.api_key_sha256"),
        (f"[{hash_key('crunch-key')}]", "[]", "tenants.crunch.api_key_sha256"),
        ("tenants:", "tenantz:", "tenantz"),
        (f"[{hash_key('admin-key')}]", "7", "admin_key_sha256"),
    ],
)
def test_errors_name_the_file_and_the_field(
    tmp_path: Path, tenants_text: str, old: str, new: str, field: str
) -> None:
    path = tmp_path / "tenants.yaml"
    text = tenants_text
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(TenantsFileError) as e:
        load_tenants(path)
    assert str(e.value).startswith(f"{path}: {field}"), str(e.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError, match="cannot read"):
        load_tenants(tmp_path / "missing.yaml")
    bad = tmp_path / "t.toml"
    bad.write_text("[tenants\n")
    with pytest.raises(TenantsFileError, match=r"t\.toml: not valid TOML"):
        load_tenants(bad)
    other = tmp_path / "t.json"
    other.write_text("{}")
    with pytest.raises(TenantsFileError, match=r"\.yaml, \.yml or \.toml"):
        load_tenants(other)
    with pytest.raises(TenantsFileError, match="tenants: at least one tenant"):
        parse_tenants({"tenants": {}}, "x.yaml")
    with pytest.raises(TenantsFileError, match="tiers.gold.priority: required"):
        parse_tenants({"tiers": {"gold": {"weight": 2}}, "tenants": {}}, "x.yaml")


def test_cache_groups_set_the_prefix_cache_salt(tmp_path: Path, tenants_text: str) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_text.replace("weight: 2", "weight: 2\n    cache_group: acme", 1))
    by_name = {t.name: t.tenant() for t in load_tenants(path).tenants}
    assert by_name["carol"].cache_group == "acme"
    assert by_name["carol"].cache_salt == "group:acme"
    # Without a group a tenant shares with nobody, not even a group named like it.
    assert by_name["acme"].cache_salt == "tenant:acme" != by_name["carol"].cache_salt


def test_adapters_a_tenant_may_use(tmp_path: Path, tenants_text: str) -> None:
    path = tmp_path / "tenants.yaml"
    text = tenants_text.replace("weight: 2", "weight: 2\n    adapters: [support, legal]", 1)
    path.write_text(text.replace("tier: batch", 'tier: batch\n    adapters: "*"', 1))
    by_name = {t.name: t.tenant() for t in load_tenants(path).tenants}
    carol, crunch, acme = by_name["carol"], by_name["crunch"], by_name["acme"]
    assert carol.adapters == {"support", "legal"}
    assert carol.may_use("legal") and not carol.may_use("other")
    assert crunch.adapters is None and crunch.may_use("anything")  # "*"
    assert acme.adapters == frozenset() and not acme.may_use("support")  # none by default
