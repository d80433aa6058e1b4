"""Who may use the internal routes (`/v1/replica/*`, `/v1/stats`, `/metrics`, the details of
`/health`), and a replica API that validates what it is sent, against real `headrace serve`
processes on 127.0.0.1: a `remote` with a tenants file and an admin key (tiny model), and a
`front` with a tenants file and no admin key at all that routes to it (`--replicas 0`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, sse_events, tiny_server_args
from tokenizers import Tokenizer

from headrace.gateway.auth import hash_key

ADMIN = "admin-secret"
TENANTS = f"""
tenants:
  acme: {{tier: paid, api_key_sha256: [{hash_key("acme-key")}]}}
"""


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("internal-model") / "tiny")


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("internal-tenants") / "tenants.yaml"
    path.write_text(TENANTS)
    return path


@pytest.fixture(scope="module")
def remote(
    model: Path, tenants: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    args = tiny_server_args(model) + ["--tenants", str(tenants), "--admin-key", ADMIN]
    yield from serving(args, tmp_path_factory.mktemp("internal-remote"))


@pytest.fixture(scope="module")
def front(
    remote: Server, tenants: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    args = ["--replicas", "0", "--replica-url", remote.url, "--replica-api-key", ADMIN,
            "--tenants", str(tenants), "--log-level", "warning"]  # fmt: skip
    yield from serving(args, tmp_path_factory.mktemp("internal-front"))


def replica_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "request_id": "wire-1", "model": "tiny", "prompt_token_ids": [1, 5, 9],
        "params": {"max_tokens": 4, "temperature": 0, "ignore_eos": True}, "options": {},
    }  # fmt: skip
    for key, value in changes.items():
        if key in ("params", "options"):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return body


def replica_generate(url: str, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = auth(key) if key else {}
    return httpx.post(url + "/v1/replica/generate", json=body, headers=headers, timeout=30)


def events(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(e) for e in sse_events(r.text.splitlines()) if e != "[DONE]"]


def engine_state(remote: Server) -> dict[str, Any]:
    stats = httpx.get(remote.url + "/v1/stats", headers=auth(ADMIN), timeout=10).json()
    replica: dict[str, Any] = stats["models"]["tiny"]["replicas"][0]
    return replica


def test_the_replica_api_needs_the_admin_key(remote: Server) -> None:
    for key in (None, "acme-key", "wrong"):  # a tenant's key is not the admin key
        r = replica_generate(remote.url, replica_body(), key)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "authentication_error"
        headers = auth(key) if key else {}
        abort = {"request_id": "x", "model": "tiny"}
        r = httpx.post(remote.url + "/v1/replica/abort", json=abort, headers=headers)
        assert r.status_code == 401
        assert httpx.get(remote.url + "/v1/stats", headers=headers).status_code == 401
    # the key is checked before the body: a stranger learns nothing from a validation error
    bad = replica_generate(remote.url, replica_body(options={"weight": 0}), None)
    assert bad.status_code == 401
    r = replica_generate(remote.url, replica_body(), ADMIN)
    assert r.status_code == 200, r.text
    got = events(r)
    assert got[-1]["finish_reason"] == "length" and got[-1]["completion_tokens"] == 4


def test_without_an_admin_key_configured_the_internal_routes_refuse_everyone(
    front: Server,
) -> None:
    for key in (None, "acme-key", ADMIN):
        r = replica_generate(front.url, replica_body(), key)
        assert r.status_code == 401, r.text
        assert "--admin-key" in r.json()["error"]["message"]
        headers = auth(key) if key else {}
        assert httpx.get(front.url + "/v1/stats", headers=headers).status_code == 401
        assert httpx.get(front.url + "/metrics", headers=headers).status_code == 401
        health = httpx.get(front.url + "/health", headers=headers)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert "none is set" in front.log()  # the operator was told at start
    # the front end itself reaches its remote replica with the admin key
    body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 3, "ignore_eos": True}
    r = httpx.post(front.url + "/v1/completions", json=body, headers=auth("acme-key"), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def test_metrics_and_health_details_need_the_admin_key(remote: Server) -> None:
    r = httpx.get(remote.url + "/metrics")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(remote.url + "/metrics", headers=auth("acme-key")).status_code == 401
    metrics = httpx.get(remote.url + "/metrics", headers=auth(ADMIN))
    assert metrics.status_code == 200 and "headrace:num_requests_running" in metrics.text
    for headers in ({}, auth("acme-key")):
        health = httpx.get(remote.url + "/health", headers=headers)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
    details = httpx.get(remote.url + "/health", headers=auth(ADMIN)).json()
    assert details["status"] == "ok" and details["replicas"]["tiny"][0]["pid"]


# (change to the body, the field the 400 names); "VOCAB": the first id past the vocabulary
WIRE_CASES: list[tuple[dict[str, Any], str]] = [
    ({"options": {"weight": 0}}, "options.weight"),
    ({"options": {"weight": -3.5}}, "options.weight"),
    ({"options": {"timeout_s": "x"}}, "options.timeout_s"),
    ({"options": {"queue_timeout_s": 0}}, "options.queue_timeout_s"),
    ({"options": {"priority": 99}}, "options.priority"),
    ({"options": {"tenant": ""}}, "options.tenant"),
    ({"options": {"arrival_time": 12.0}}, "options.arrival_time"),
    ({"options": {"bogus": 1}}, "options.bogus"),
    ({"params": {"max_tokens": 0}}, "params.max_tokens"),
    ({"params": {"temperature": "hot"}}, "params.temperature"),
    ({"params": {"top_p": 2}}, "params.top_p"),
    ({"params": {"logprobs": 99}}, "params.logprobs"),
    ({"params": {"stop_token_ids": "VOCAB"}}, "params.stop_token_ids"),
    ({"params": {"logit_bias": "VOCAB"}}, "params.logit_bias"),
    ({"params": {"bad_words": "VOCAB"}}, "params.bad_words"),
    ({"params": {"presence_penalty": 3}}, "params.presence_penalty"),
    ({"params": {"min_tokens": 17}}, "params.min_tokens"),  # over max_tokens (16)
    ({"prompt_token_ids": "VOCAB"}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, -2]}, "prompt_token_ids.1"),
    ({"prompt_token_ids": [1, "2"]}, "prompt_token_ids.1"),
    ({"prompt_token_ids": []}, "prompt_token_ids"),
]


def vocab_size(model: Path) -> int:
    return int(Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size(True))


def _past_vocab(field: str, vocab: int) -> object:
    """A value of `field` naming the first id past the model's vocabulary."""
    return {"logit_bias": {str(vocab): 1.0}, "bad_words": [[1, vocab]]}.get(field, [vocab])


def wire_change(change: dict[str, Any], vocab: int) -> dict[str, Any]:
    """A `WIRE_CASES` change with "VOCAB" made the first id past a vocabulary of `vocab` ids."""
    change = dict(change)
    for key, value in change.items():
        if value == "VOCAB":
            change[key] = [1, vocab]
        elif isinstance(value, dict):
            change[key] = {
                k: _past_vocab(k, vocab) if v == "VOCAB" else v for k, v in value.items()
            }
    return change


@pytest.mark.parametrize(("change", "field"), WIRE_CASES)
def test_a_bad_wire_value_is_a_400_naming_the_field(
    remote: Server, model: Path, change: dict[str, Any], field: str
) -> None:
    before, vocab = engine_state(remote), vocab_size(model)
    r = replica_generate(remote.url, replica_body(**wire_change(change, vocab)), ADMIN)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error", error
    # the engine core never saw it: same process, no restart, and it serves on
    ok = replica_generate(remote.url, replica_body(prompt_token_ids=[1, vocab - 1]), ADMIN)
    assert ok.status_code == 200 and events(ok)[-1]["finish_reason"] == "length", ok.text
    after = engine_state(remote)
    assert (after["pid"], after["restarts"], after["state"]) == (
        before["pid"], before["restarts"], "healthy",
    )  # fmt: skip
    assert after["restarts"] == 0
