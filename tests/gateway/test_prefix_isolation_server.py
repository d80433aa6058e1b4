"""Prefix caching across tenants, end to end: a real `headrace serve --tenants FILE`.

A cached prefix answers faster, so a tenant that could hit another's cache could time its
prompts. Tenants therefore share cached blocks only within a `cache_group`.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from factories import (
    Server,
    make_tiny_llama,
    read_metrics,
    serving,
    tiny_server_args,
    write_tenants,
)

from headrace.gateway.auth import hash_key

TENANTS = f"""
admin_key_sha256: [{hash_key("admin")}]
tenants:
  alice: {{tier: paid, api_key_sha256: [{hash_key("alice")}]}}
  bob: {{tier: paid, api_key_sha256: [{hash_key("bob")}]}}
  acme-eu: {{tier: free, cache_group: acme, api_key_sha256: [{hash_key("acme-eu")}]}}
  acme-us: {{tier: free, cache_group: acme, api_key_sha256: [{hash_key("acme-us")}]}}
"""
# About 60 tokens with the tiny tokenizer: three full blocks of 16 to reuse.
PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_tiny_llama(tmp_path_factory.mktemp("prefix-tenants") / "tiny-llama")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("prefix-isolation")
    args = tiny_server_args(model) + ["--tenants", str(write_tenants(tmp, TENANTS))]
    yield from serving(args, tmp)


def _complete(server: Server, key: str, prompt: str = PROMPT) -> dict[str, int]:
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "temperature": 0},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }


def test_tenants_never_hit_each_others_prompts_but_a_cache_group_shares(server: Server) -> None:
    admin = {"authorization": "Bearer admin"}
    first = _complete(server, "alice")
    assert first["cached"] == 0 and first["prompt"] > 48
    again = _complete(server, "alice")
    assert again["cached"] == (first["prompt"] - 1) // 16 * 16  # every full block but the last
    # Bob sends Alice's exact prompt: no hit, nothing to time.
    assert _complete(server, "bob")["cached"] == 0
    # Two keys of one cache group share, and the group does not see Alice's blocks.
    assert _complete(server, "acme-eu")["cached"] == 0
    assert _complete(server, "acme-us")["cached"] == again["cached"]

    m = read_metrics(server.url, admin)
    hits = 2 * again["cached"]
    assert m['headrace:prefix_cache_hits_total{model_name="tiny"}'] == hits
    assert m['headrace:prefix_cache_queries_total{model_name="tiny"}'] == 5 * first["prompt"]
    assert m['headrace:tier_prefix_cache_hits_total{model_name="tiny",tier="paid"}'] == hits / 2
    assert m['headrace:tier_prefix_cache_hits_total{model_name="tiny",tier="free"}'] == hits / 2
    stats = httpx.get(server.url + "/v1/stats", headers=admin, timeout=10).json()
    assert stats["models"]["tiny"]["prefix_cache_hit_rate"] == pytest.approx(
        hits / (5 * first["prompt"]), abs=1e-3
    )
    assert stats["models"]["tiny"]["stats"]["kv_blocks_used"] == 0


def test_the_cache_can_be_turned_off(model, tmp_path_factory: pytest.TempPathFactory) -> None:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("prefix-off")
    args = tiny_server_args(model) + ["--no-enable-prefix-caching"]
    for server in serving(args, tmp):
        assert _complete(server, "unused")["cached"] == 0
        assert _complete(server, "unused")["cached"] == 0
        m = read_metrics(server.url)
        assert m["headrace:prefix_cache_queries_total"] == 0
