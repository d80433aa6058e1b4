"""The ledger behind a real `headrace serve` on 127.0.0.1 (tiny model, a tenants file and an
admin key): what the clients were told in `usage` is what the ledger sums, over streams,
non-streams, `n` > 1, a refusal and a cancelled stream; each tenant sees only its own; the
admin key sees all and the audit log; a graceful stop writes every record and a restarted
server keeps appending to the same file."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import (
    Server,
    make_tiny_llama,
    running,
    serving,
    sse_events,
    tiny_server_args,
    wait_for,
)

from headrace.gateway.auth import hash_key
from headrace.ledger import store
from headrace.ledger.records import key_id

ADMIN = "ledger-admin-key"
KEYS = {"acme": "acme-key", "bob": "bob-key"}
PROMPT = "Hello there"


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("ledger-model") / "tiny")


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = [f"admin_key_sha256: [{hash_key(ADMIN)}]", "tenants:"]
    for name, key in KEYS.items():
        lines.append(f"  {name}: {{tier: paid, api_key_sha256: [{hash_key(key)}]}}")
    path = tmp_path_factory.mktemp("ledger-tenants") / "tenants.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def server_args(model: Path, tenants: Path, ledger: Path, flush_s: float) -> list[str]:
    return tiny_server_args(model) + [
        "--tenants", str(tenants), "--admin-key", ADMIN, "--ledger", str(ledger),
        "--ledger-flush-s", str(flush_s),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def ledger_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger-server") / "ledger.db"


@pytest.fixture(scope="module")
def server(model: Path, tenants: Path, ledger_db: Path) -> Iterator[Server]:
    # A long flush period: what the routes read, they read because the ledger syncs first.
    args = server_args(model, tenants, ledger_db, 30.0)
    yield from serving(args, ledger_db.parent, exits=(0,))


def streamed_usage(c: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    usage: dict[str, Any] = json.loads(events[-2])["usage"]
    return usage


def cancel_stream(c: httpx.Client) -> int:
    """A stream the client hangs up on after a few events; returns the tokens it saw."""
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    seen = 0
    with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            seen += len(sse_events([line]))
            if seen == 3:
                break  # leaving the block closes the connection mid-stream
    return seen


def acme_traffic(c: httpx.Client) -> tuple[list[dict[str, Any]], int]:
    """The mixed run: the `usage` objects the client received, and the cancelled stream's
    tokens seen."""
    plain = {"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2}
    got = [c.post("/v1/completions", json=plain).json()["usage"]]
    got.append(streamed_usage(c, "/v1/completions", {**plain, "max_tokens": 7}))
    got.append(c.post("/v1/completions", json={**plain, "n": 3}).json()["usage"])
    got.append(streamed_usage(c, "/v1/chat/completions", {**chat, "ignore_eos": True}))
    generated = c.post("/v1/generate", json=plain).json()["usage"]
    got.append(
        {**generated, "prompt_tokens_details": {"cached_tokens": generated["cached_tokens"]}}
    )
    refused = c.post("/v1/completions", json={**plain, "max_tokens": 100_000})
    assert refused.status_code == 400
    return got, cancel_stream(c)


def usage(server: Server, key: str, **params: str) -> httpx.Response:
    return httpx.get(server.url + "/v1/usage", params=params, headers=auth(key), timeout=30)


def test_the_ledger_sums_what_the_clients_were_told(server: Server, ledger_db: Path) -> None:
    with httpx.Client(base_url=server.url, headers=auth(KEYS["acme"]), timeout=60) as c:
        received, cancelled_seen = acme_traffic(c)
    assert httpx.post(
        server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2},
        headers=auth(KEYS["bob"]), timeout=60,
    ).status_code == 200  # fmt: skip
    prompt = sum(u["prompt_tokens"] for u in received)
    completion = sum(u["completion_tokens"] for u in received)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in received)

    def seven() -> bool:  # the cancelled stream's record lands once the server sees it go
        return usage(server, KEYS["acme"]).json()["totals"]["requests"] == 7

    wait_for(seven, 20, "acme's 7 records")
    (row,) = usage(server, KEYS["acme"]).json()["data"]
    single_prompt = received[0]["prompt_tokens"]  # the cancelled stream's prompt is the same
    assert row["tenant"] == "acme" and row["errors"] == 2  # the 400 and the cancel (499)
    assert row["prompt_tokens"] == prompt + single_prompt
    assert completion + cancelled_seen <= row["completion_tokens"] <= completion + 400
    assert row["cached_tokens"] >= cached
    assert row["total_tokens"] == row["prompt_tokens"] + row["completion_tokens"]
    by_status = records(ledger_db, "acme")
    assert sorted(by_status) == [200, 400, 499]
    assert by_status[200] == (len(received), prompt, completion, cached)
    assert by_status[400] == (1, 0, 0, 0)  # refused before the engine: no tokens
    assert by_status[499][:2] == (1, single_prompt)


def records(db: Path, tenant: str) -> dict[int, tuple[int, int, int, int]]:
    """The ledger file's rows of `tenant` by HTTP status: count, prompt, completion, cached."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT http_status, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
            "SUM(cached_tokens) FROM usage WHERE tenant = ? GROUP BY http_status",
            (tenant,),
        ).fetchall()
    return {status: (n, p, c, k) for status, n, p, c, k in rows}


def test_each_tenant_sees_its_own_and_the_admin_all(server: Server) -> None:
    bob = usage(server, KEYS["bob"], group_by="model").json()
    assert [(r["tenant"], r["model"]) for r in bob["data"]] == [("bob", "tiny")]
    assert usage(server, KEYS["bob"], tenant="acme").status_code == 403
    assert httpx.get(server.url + "/v1/usage", timeout=10).status_code == 401
    everyone = usage(server, ADMIN, group_by="day").json()["data"]
    assert {r["tenant"] for r in everyone} == {"acme", "bob"} and all("day" in r for r in everyone)
    assert [r["tenant"] for r in usage(server, ADMIN, tenant="bob").json()["data"]] == ["bob"]
    bad = usage(server, ADMIN, group_by="week")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"
    future = usage(server, ADMIN, start="2999-01-01").json()
    assert future["data"] == [] and future["totals"]["requests"] == 0


def test_admin_actions_go_to_the_audit_log(server: Server) -> None:
    url = server.url
    assert httpx.post(url + "/admin/reload", headers=auth(KEYS["bob"])).status_code == 401
    assert httpx.post(url + "/admin/reload", headers=auth(ADMIN)).status_code == 200
    server.proc.send_signal(signal.SIGHUP)

    def entries() -> list[dict[str, Any]]:
        r = httpx.get(url + "/v1/audit", headers=auth(ADMIN), timeout=10)
        assert r.status_code == 200, r.text
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    wait_for(lambda: len(entries()) == 2, 20, "two audit entries")
    sighup, post = entries()  # newest first
    assert (post["action"], post["key_id"], post["status"]) == (
        "tenants.reload",
        key_id(ADMIN),
        200,
    )
    assert post["arguments"] == {"via": "POST /admin/reload"} and post["result"]["tenants"] == 2
    assert (sighup["arguments"], sighup["key_id"]) == ({"via": "SIGHUP"}, None)
    assert ADMIN not in json.dumps(entries())
    assert httpx.get(url + "/v1/audit", headers=auth(KEYS["acme"])).status_code == 401


def test_a_graceful_stop_writes_every_record_and_a_restart_appends(
    model: Path, tenants: Path, tmp_path: Path
) -> None:
    db = tmp_path / "ledger.db"
    body = {"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True}
    with running(server_args(model, tenants, db, 60.0), tmp_path) as first:
        c = httpx.Client(base_url=first.url, headers=auth(KEYS["acme"]), timeout=60)
        told = [c.post("/v1/completions", json=body).json()["usage"] for _ in range(3)]
        told.append(streamed_usage(c, "/v1/completions", body))
        c.close()
    # SIGTERM came well before the 60 s flush: only the graceful stop can have written them
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, prompt_tokens, completion_tokens FROM usage").fetchall()
    assert [(p, n) for _, p, n in rows] == [
        (u["prompt_tokens"], u["completion_tokens"]) for u in told
    ]  # fmt: skip
    with running(server_args(model, tenants, db, 0.2), tmp_path) as second:
        r = httpx.post(second.url + "/v1/completions", json=body, headers=auth(KEYS["acme"]))
        assert r.status_code == 200
        assert usage(second, KEYS["acme"]).json()["totals"]["requests"] == 5
    with sqlite3.connect(db) as conn:
        assert [i for (i,) in conn.execute("SELECT id FROM usage ORDER BY id")] == [1, 2, 3, 4, 5]


def test_a_sigkill_loses_at_most_the_last_flush_period(
    model: Path, tenants: Path, tmp_path: Path
) -> None:
    db, flush_s = tmp_path / "ledger.db", 0.2
    body = {"prompt": PROMPT, "max_tokens": 2}
    with running(server_args(model, tenants, db, flush_s), tmp_path, clean_exit=False) as s:
        for _ in range(3):
            r = httpx.post(s.url + "/v1/completions", json=body, headers=auth(KEYS["acme"]))
            assert r.status_code == 200
        time.sleep(5 * flush_s)  # longer than a flush period: written by the ledger's thread
        s.proc.kill()
        s.proc.wait()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM usage").fetchone()[0] == 3


def test_two_front_ends_share_one_postgresql_ledger(
    model: Path, tenants: Path, tmp_path: Path, postgres_url: Callable[[], str]
) -> None:
    url = postgres_url()
    body = {"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True}
    told = []
    with (
        running(server_args(model, tenants, url, 30.0), tmp_path) as one,
        running(server_args(model, tenants, url, 30.0), tmp_path) as two,
    ):
        for server, key in ((one, KEYS["acme"]), (two, KEYS["acme"]), (two, KEYS["bob"])):
            with httpx.Client(base_url=server.url, headers=auth(key), timeout=60) as c:
                told.append(streamed_usage(c, "/v1/completions", body))
        # two syncs its own records before it reads; one's may still be in one's queue
        assert usage(two, ADMIN).json()["totals"]["requests"] >= 2
    # both stopped gracefully: every record of both is in the one ledger
    db = store.connect(url)
    try:
        rows = db.execute("SELECT tenant, prompt_tokens, completion_tokens FROM usage ORDER BY id")
    finally:
        db.close()
    assert sorted((r["tenant"], r["completion_tokens"]) for r in rows) == [
        ("acme", 3), ("acme", 3), ("bob", 3),
    ]  # fmt: skip
    assert sum(r["prompt_tokens"] for r in rows) == sum(u["prompt_tokens"] for u in told)
