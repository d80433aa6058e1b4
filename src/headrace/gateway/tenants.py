"""The tenants file: who may call, in which tier, with which limits.

YAML (`.yaml`, `.yml`) or TOML (`.toml`). Keys are stored as SHA-256 hex digests, never in
clear; make one with
`python -c 'import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())' KEY`.

    tiers:                  # optional: merged over the defaults below
      paid:  {priority: 0, weight: 1.0, queue_timeout_s: 5}
    admin_key_sha256: [<hex>]          # optional: protects /metrics
    tenants:
      acme:
        tier: paid
        api_key_sha256: [<hex>, ...]
        tokens_per_minute: 200000      # prompt + completion; omitted = unlimited
        max_concurrent: 32             # omitted = unlimited
        weight: 2.0                    # optional overrides of the tier's values
        priority: 0
        queue_timeout_s: 10
        cache_group: acme-shared       # optional: share cached prompt prefixes with the
                                       # other tenants of this group (default: with none)
        adapters: [acme-support]       # optional: LoRA adapters it may use, or "*" for all
                                       # (default: none; others are 404 as if absent)

Every error names the file and the field (`tenants.yaml: tenants.acme.tier: ...`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from headrace.gateway.base import Tenant

_HEX64 = re.compile(r"[0-9a-f]{64}")
_TENANT_FIELDS = {
    "tier",
    "api_key_sha256",
    "tokens_per_minute",
    "max_concurrent",
    "priority",
    "weight",
    "queue_timeout_s",
    "cache_group",
    "adapters",
}


class TenantsFileError(ValueError):
    """A tenants file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Tier:
    name: str
    priority: int  # lower is more urgent
    weight: float  # fair-share weight of each tenant within the tier
    queue_timeout_s: float | None  # not started by then -> 503 overloaded


DEFAULT_TIERS: dict[str, Tier] = {
    "paid": Tier("paid", 0, 1.0, 5.0),
    "free": Tier("free", 1, 1.0, 5.0),
    # Batch fills leftover capacity only: it is admitted after every more urgent request, so
    # it may wait longer.
    "batch": Tier("batch", 2, 1.0, 60.0),
}


@dataclass(frozen=True)
class TenantSpec:
    """One tenant with the tier's values already resolved against its overrides."""

    name: str
    tier: str
    key_hashes: tuple[str, ...]
    priority: int
    weight: float
    queue_timeout_s: float | None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    cache_group: str | None = None
    adapters: frozenset[str] | None = frozenset()  # None: all ("*")

    def tenant(self) -> Tenant:
        return Tenant(
            self.name, self.tier, self.priority, self.weight, self.queue_timeout_s,
            self.cache_group, self.adapters,
        )  # fmt: skip


@dataclass(frozen=True)
class TenantsConfig:
    tenants: tuple[TenantSpec, ...]
    tiers: Mapping[str, Tier]
    admin_key_hashes: tuple[str, ...] = ()
    source: str = "<tenants>"


def load_tenants(path: str | Path) -> TenantsConfig:
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TenantsFileError(f"{name}: cannot read the tenants file: {e.strerror}") from e
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise TenantsFileError(f"{name}: the tenants file must end in .yaml, .yml or .toml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise TenantsFileError(f"{name}: not valid {path.suffix[1:].upper()}: {e}") from e
    return parse_tenants(data, name)


def parse_tenants(data: object, source: str = "<tenants>") -> TenantsConfig:
    p = _Parser(source)
    top = p.mapping(data, "", {"tiers", "tenants", "admin_key_sha256"})
    tiers = dict(DEFAULT_TIERS)
    for name, raw in p.mapping(top.get("tiers", {}), "tiers").items():
        tiers[name] = p.tier(name, raw)
    tenants_raw = p.mapping(top.get("tenants"), "tenants")
    if not tenants_raw:
        raise TenantsFileError(f"{source}: tenants: at least one tenant is required")
    tenants = tuple(p.tenant(name, raw, tiers) for name, raw in tenants_raw.items())
    admin = p.hashes(top.get("admin_key_sha256", []), "admin_key_sha256", allow_empty=True)
    seen: dict[str, str] = {}
    for spec in tenants:
        for h in spec.key_hashes:
            if h in seen:
                raise TenantsFileError(
                    f"{source}: tenants.{spec.name}.api_key_sha256: key already belongs to "
                    f"tenant {seen[h]!r}"
                )
            seen[h] = spec.name
    return TenantsConfig(tenants, tiers, admin, source)


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> TenantsFileError:
        prefix = f"{self.source}: {where}" if where else self.source
        return TenantsFileError(f"{prefix}: {message}")

    def mapping(self, raw: object, where: str, allowed: set[str] | None = None) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(where, f"expected a mapping, got {_kind(raw)}")
        for key in raw:
            if not isinstance(key, str) or not key:
                raise self.fail(where, f"keys must be non-empty strings, got {key!r}")
            if allowed is not None and key not in allowed:
                expected = f"unknown field; expected one of {sorted(allowed)}"
                raise self.fail(_join(where, key), expected)
        return raw

    def tier(self, name: str, raw: object) -> Tier:
        where = f"tiers.{name}"
        base = DEFAULT_TIERS.get(name)
        fields = self.mapping(raw, where, {"priority", "weight", "queue_timeout_s"})
        if base is None and "priority" not in fields:
            raise self.fail(f"{where}.priority", "required for a new tier")
        return Tier(
            name,
            self.priority(fields.get("priority", base.priority if base else 0), where),
            self.weight(fields.get("weight", base.weight if base else 1.0), where),
            self.timeout(
                fields.get("queue_timeout_s", base.queue_timeout_s if base else None), where
            ),
        )

    def tenant(self, name: str, raw: object, tiers: Mapping[str, Tier]) -> TenantSpec:
        where = f"tenants.{name}"
        f = self.mapping(raw, where, _TENANT_FIELDS)
        tier_name = f.get("tier", "free")
        if tier_name not in tiers:
            raise self.fail(f"{where}.tier", f"unknown tier {tier_name!r}; known: {sorted(tiers)}")
        tier = tiers[tier_name]
        if "api_key_sha256" not in f:
            raise self.fail(f"{where}.api_key_sha256", "required (a list of SHA-256 hex digests)")
        return TenantSpec(
            name=name,
            tier=tier_name,
            key_hashes=self.hashes(f["api_key_sha256"], f"{where}.api_key_sha256"),
            priority=self.priority(f.get("priority", tier.priority), where),
            weight=self.weight(f.get("weight", tier.weight), where),
            queue_timeout_s=self.timeout(f.get("queue_timeout_s", tier.queue_timeout_s), where),
            tokens_per_minute=self.limit(f.get("tokens_per_minute"), f"{where}.tokens_per_minute"),
            max_concurrent=self.limit(f.get("max_concurrent"), f"{where}.max_concurrent"),
            cache_group=self.group(f.get("cache_group"), f"{where}.cache_group"),
            adapters=self.adapters(f.get("adapters", []), f"{where}.adapters"),
        )

    def hashes(self, raw: object, where: str, allow_empty: bool = False) -> tuple[str, ...]:
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or (not items and not allow_empty):
            raise self.fail(where, "expected a non-empty list of SHA-256 hex digests")
        out = []
        for i, h in enumerate(items):
            if not isinstance(h, str) or not _HEX64.fullmatch(h.strip().lower()):
                raise self.fail(
                    f"{where}[{i}]",
                    "expected a SHA-256 hex digest (64 hex digits), not a key in clear; make one "
                    "with python -c 'import hashlib,sys; "
                    "print(hashlib.sha256(sys.argv[1].encode()).hexdigest())' KEY",
                )
            out.append(h.strip().lower())
        return tuple(out)

    def priority(self, raw: object, where: str) -> int:
        v = _int(raw)
        if v is None or not 0 <= v <= 9:
            raise self.fail(f"{where}.priority", f"expected an integer 0..9, got {raw!r}")
        return v

    def weight(self, raw: object, where: str) -> float:
        v = _number(raw)
        if v is None or not 0 < v <= 1000:
            raise self.fail(f"{where}.weight", f"expected a number in (0, 1000], got {raw!r}")
        return v

    def timeout(self, raw: object, where: str) -> float | None:
        v = _number(raw)
        if raw is not None and (v is None or v <= 0):
            raise self.fail(f"{where}.queue_timeout_s", f"expected seconds > 0, got {raw!r}")
        return v

    def group(self, raw: object, where: str) -> str | None:
        if raw is not None and (not isinstance(raw, str) or not raw.strip()):
            raise self.fail(where, f"expected a non-empty string, got {raw!r}")
        return raw

    def adapters(self, raw: object, where: str) -> frozenset[str] | None:
        if raw == "*":
            return None
        if not isinstance(raw, list) or not all(isinstance(a, str) and a for a in raw):
            raise self.fail(where, f'expected a list of adapter names or "*", got {raw!r}')
        return frozenset(raw)

    def limit(self, raw: object, where: str) -> int | None:
        v = _int(raw)
        if raw is not None and (v is None or v < 1):
            raise self.fail(where, f"expected a positive integer, got {raw!r}")
        return v


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _kind(x: object) -> str:
    return "nothing" if x is None else type(x).__name__


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
