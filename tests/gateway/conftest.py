from __future__ import annotations

from pathlib import Path

import pytest

from headrace.gateway.auth import hash_key


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tenants_text() -> str:
    return tenants_yaml()


def tenants_yaml(**overrides: str) -> str:
    """A tenants file with tenants acme (paid), bob and carol (free), crunch (batch)."""
    text = f"""
admin_key_sha256: [{hash_key("admin-key")}]
tenants:
  acme:
    tier: paid
    api_key_sha256: [{hash_key("acme-key")}, {hash_key("acme-key-2")}]
    tokens_per_minute: 6000
    max_concurrent: 2
  bob:
    tier: free
    api_key_sha256: [{hash_key("bob-key")}]
    tokens_per_minute: 600
  carol:
    api_key_sha256: {hash_key("carol-key")}
    weight: 2
  crunch:
    tier: batch
    api_key_sha256: [{hash_key("crunch-key")}]
"""
    for old, new in overrides.items():
        text = text.replace(old, new)
    return text


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_yaml())
    return path
