"""The Batch API behind a real `headrace serve` on 127.0.0.1 (tiny model, a tenants file, a
ledger): each output line's body is what the same request gets over HTTP (greedy); the
official `openai` SDK drives it unmodified; a cancel stops a batch with what it finished; a
tenant sees none of another's; a malformed upload is refused naming its line; every line is in
the ledger; a server killed mid-batch resumes it, running no finished line again; a paid
request overtakes a running batch."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from factories import Server, make_tiny_llama, running, serving, tiny_server_args, wait_for

from headrace.gateway.auth import hash_key
from headrace.ledger.records import key_id

KEYS = {"acme": "acme-key", "bob": "bob-key"}
ENDED = ("completed", "failed", "cancelled", "expired")


def auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("batch-model") / "tiny")


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = ["tenants:"]
    for name, key in KEYS.items():
        lines.append(f"  {name}: {{tier: paid, api_key_sha256: [{hash_key(key)}]}}")
    path = tmp_path_factory.mktemp("batch-tenants") / "tenants.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def server_args(model: Path, tenants: Path, state: Path, *extra: str) -> list[str]:
    return tiny_server_args(model) + [
        "--tenants", str(tenants), "--ledger", str(state / "ledger.db"), "--ledger-flush-s",
        "0.2", "--batch-dir", str(state / "batches"), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batch-state")


@pytest.fixture(scope="module")
def server(model: Path, tenants: Path, state: Path) -> Iterator[Server]:
    yield from serving(server_args(model, tenants, state, "--batch-max-file-bytes", "100000"),
                       state)  # fmt: skip


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def completion_lines(n: int, **body: Any) -> list[dict[str, Any]]:
    return [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "tiny", "prompt": f"Story {i}:", "max_tokens": 6, "temperature": 0,
                  **body}}
        for i in range(n)
    ]  # fmt: skip


def upload(url: str, tenant: str, data: bytes) -> httpx.Response:
    files = {"file": ("input.jsonl", data, "application/jsonl")}
    return httpx.post(url + "/v1/files", files=files, data={"purpose": "batch"},
                      headers=auth(tenant), timeout=30)  # fmt: skip


def start_batch(url: str, tenant: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    f = upload(url, tenant, jsonl(lines))
    assert f.status_code == 200, f.text
    body = {"input_file_id": f.json()["id"], "endpoint": lines[0]["url"],
            "completion_window": "24h"}  # fmt: skip
    r = httpx.post(url + "/v1/batches", json=body, headers=auth(tenant), timeout=30)
    assert r.status_code == 200, r.text
    made: dict[str, Any] = r.json()
    return made


def get_batch(url: str, batch_id: str, tenant: str = "acme") -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/batches/{batch_id}", headers=auth(tenant), timeout=30)
    assert r.status_code == 200, r.text
    batch: dict[str, Any] = r.json()
    return batch


def wait_ended(url: str, batch_id: str, timeout: float = 120) -> dict[str, Any]:
    wait_for(lambda: get_batch(url, batch_id)["status"] in ENDED, timeout, f"{batch_id} to end")
    return get_batch(url, batch_id)


def content(url: str, file_id: str, tenant: str = "acme") -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/v1/files/{file_id}/content", headers=auth(tenant), timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines()]


def test_each_output_line_is_what_the_request_gets_over_http(server: Server, state: Path) -> None:
    lines = completion_lines(4)
    lines.append({**lines[0], "custom_id": "too-long", "body": {"prompt": "x", "max_tokens": 9999}})
    made = start_batch(server.url, "acme", lines)
    done = wait_ended(server.url, made["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    assert done["in_progress_at"] and done["finalizing_at"] and done["completed_at"]
    out = content(server.url, done["output_file_id"])
    assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(4)]
    with httpx.Client(base_url=server.url, headers=auth("acme"), timeout=60) as c:
        for line, result in zip(lines, out, strict=False):
            direct = c.post(line["url"], json=line["body"]).json()
            got = result["response"]["body"]
            assert result["response"]["status_code"] == 200 and result["error"] is None
            assert got["choices"] == direct["choices"] and got["usage"] == direct["usage"]
            assert result["response"]["request_id"] == got["id"]
    (err,) = content(server.url, done["error_file_id"])
    assert err["custom_id"] == "too-long" and err["response"]["status_code"] == 400
    records = ledger_records(server, state, "acme")  # each line is in it, as a batch line
    for x in out:
        record = records[x["response"]["request_id"]]
        assert record == ("batch:/v1/completions", key_id(KEYS["acme"]), 200)
    refused = [r for r in records.values() if r[2] == 400 and r[0] == "batch:/v1/completions"]
    assert len(refused) == 1  # the line that failed: refused before the engine, recorded too


def ledger_records(server: Server, state: Path, tenant: str) -> dict[str, tuple[Any, ...]]:
    """request id (or a number, for a refusal) -> (route, key id, HTTP status)."""
    httpx.get(server.url + "/v1/usage", headers=auth(tenant), timeout=30)  # the ledger syncs
    with sqlite3.connect(state / "ledger.db") as conn:
        rows = conn.execute(
            "SELECT id, request_id, route, key_id, http_status FROM usage WHERE tenant = ?",
            (tenant,),
        )
        return {rid or str(n): (route, key, status) for n, rid, route, key, status in rows}


def test_the_openai_sdk_runs_a_chat_batch(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS["acme"], timeout=60)
    bodies = [{"model": "tiny", "messages": [{"role": "user", "content": f"Hi {i}"}],
               "max_tokens": 5, "temperature": 0} for i in range(3)]  # fmt: skip
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": b} for i, b in enumerate(bodies)]  # fmt: skip
    f = client.files.create(file=("chat.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(jsonl(lines))
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"owner": "sdk"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while batch.status not in ENDED and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 0)
    assert batch.metadata == {"owner": "sdk"} and batch.output_file_id is not None
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    for line, body in zip(out, bodies, strict=True):
        direct = client.chat.completions.create(**body)  # type: ignore[call-overload]
        got = line["response"]["body"]["choices"][0]["message"]["content"]
        assert got == direct.choices[0].message.content
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.batches.cancel(batch.id).status == "completed"  # ended: stays so
    assert client.files.retrieve(f.id).filename == "chat.jsonl"
    assert f.id in [x.id for x in client.files.list(purpose="batch")]
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


def test_a_cancel_stops_the_batch_with_what_it_finished(server: Server) -> None:
    made = start_batch(server.url, "acme", completion_lines(40, max_tokens=200, ignore_eos=True))
    wait_for(lambda: get_batch(server.url, made["id"])["request_counts"]["completed"] >= 1, 120,
             "a first line")  # fmt: skip
    r = httpx.post(f"{server.url}/v1/batches/{made['id']}/cancel", headers=auth("acme"))
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled"), r.text
    done = wait_ended(server.url, made["id"])
    counts = done["request_counts"]
    assert done["status"] == "cancelled" and done["cancelled_at"], done
    assert 1 <= counts["completed"] < 40 and counts["failed"] == 0
    out = content(server.url, done["output_file_id"])
    assert len(out) == counts["completed"] and all(x["response"]["status_code"] == 200 for x in out)
    time.sleep(1)  # nothing runs on after the cancel
    assert get_batch(server.url, made["id"])["request_counts"] == counts


def test_a_tenant_sees_none_of_anothers(server: Server) -> None:
    made = start_batch(server.url, "acme", completion_lines(1))
    file_id, url = made["input_file_id"], server.url
    for method, path in (
        ("GET", f"/v1/files/{file_id}"), ("GET", f"/v1/files/{file_id}/content"),
        ("DELETE", f"/v1/files/{file_id}"), ("GET", f"/v1/batches/{made['id']}"),
        ("POST", f"/v1/batches/{made['id']}/cancel"),
    ):  # fmt: skip
        r = httpx.request(method, url + path, headers=auth("bob"), timeout=30)
        assert r.status_code == 404 and "no " in r.json()["error"]["message"], (path, r.text)
    assert httpx.get(url + "/v1/batches", headers=auth("bob")).json()["data"] == []
    assert file_id not in [f["id"] for f in httpx.get(url + "/v1/files", headers=auth("bob"))
                           .json()["data"]]  # fmt: skip
    assert httpx.get(url + "/v1/files").status_code == 401
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    r = httpx.post(url + "/v1/batches", json=body, headers=auth("bob"))
    assert r.status_code == 404 and r.json()["error"]["param"] == "input_file_id"
    wait_ended(url, made["id"])


def test_a_malformed_upload_is_refused_naming_its_line(server: Server) -> None:
    good = jsonl(completion_lines(2))
    r = upload(server.url, "acme", good + b'{"custom_id": "x", "method": "GET"}\n')
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["message"], error["param"]) == ('line 3: method must be "POST"', "file")
    big = upload(server.url, "acme", good * 2000)  # over --batch-max-file-bytes 100000
    assert big.status_code == 413, big.text


def test_a_killed_or_stopped_server_resumes_the_batch_without_rerunning_a_line(
    model: Path, tenants: Path, tmp_path: Path
) -> None:
    args = server_args(model, tenants, tmp_path, "--batch-concurrency", "1")
    # Long lines (about a second each here): a restarted server takes the batch up again
    # before the test sees it ready, and short lines could all finish in that time.
    lines = completion_lines(16, max_tokens=400, ignore_eos=True)
    db = tmp_path / "batches" / "batches.db"
    before: dict[str, str] = {}
    batch_id = ""
    for target, how in ((3, "kill"), (6, "kill"), (9, "term")):  # killed twice, then stopped
        with running(args, tmp_path, clean_exit=False) as s:
            batch_id = batch_id or start_batch(s.url, "acme", lines)["id"]
            wait_lines(s.url, batch_id, target)
            if how == "kill":
                s.proc.kill()
                s.proc.wait()
            else:
                assert s.stop() == 0, s.log()  # a graceful stop mid-batch
        before.update(finished_lines(db, batch_id))
        assert target <= len(before) < len(lines)  # stopped mid-batch
    with running(args, tmp_path) as s:
        done = wait_ended(s.url, batch_id)
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 16, "completed": 16, "failed": 0}
        out = content(s.url, done["output_file_id"])
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    after = {x["custom_id"]: x["response"]["request_id"] for x in out}
    assert {k: after[k] for k in before} == before  # what was finished was not run again


def wait_lines(url: str, batch_id: str, n: int) -> None:
    def done() -> bool:
        return int(get_batch(url, batch_id)["request_counts"]["completed"]) >= n

    wait_for(done, 120, f"{n} lines of {batch_id}")


def finished_lines(db: Path, batch_id: str) -> dict[str, str]:
    """custom_id -> request id of the lines the batch's database holds as finished."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT result FROM lines WHERE batch_id = ?", (batch_id,))
        results = [json.loads(r) for (r,) in rows]
    return {x["custom_id"]: x["response"]["request_id"] for x in results}


def test_interactive_requests_overtake_a_running_batch(
    model: Path, tenants: Path, tmp_path: Path
) -> None:
    """Two sequences at most, both held by long batch lines and more lines waiting: a paid
    request still starts at once (it is admitted first and preempts a batch line): its median
    time (one token) is under a fifth of what one batch line takes alone (at the batch lines'
    priority it waits for one of them to end: 60-80 ms against a 100 ms line, here)."""
    args = server_args(model, tenants, tmp_path, "--max-num-seqs", "2", "--batch-concurrency", "4")
    lines = completion_lines(40, max_tokens=480, ignore_eos=True, prompt="Go")
    with running(args, tmp_path) as s:
        t = time.monotonic()  # one batch line's time, alone
        r = httpx.post(s.url + lines[0]["url"], json=lines[0]["body"], headers=auth("bob"))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 480
        line_s = time.monotonic() - t
        made = start_batch(s.url, "bob", lines)
        wait_for(lambda: get_batch(s.url, made["id"], "bob")["status"] == "in_progress", 30, "run")
        time.sleep(0.3)  # the batch's lines hold both sequences
        t0 = time.monotonic()
        body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
        with httpx.Client(base_url=s.url, headers=auth("acme"), timeout=60) as c:
            ttfts = []
            for _ in range(5):
                t = time.monotonic()
                assert c.post("/v1/completions", json=body).status_code == 200
                ttfts.append(time.monotonic() - t)
        batch = get_batch(s.url, made["id"], "bob")
        assert batch["status"] == "in_progress"  # the batch was still running all along
        print(f"interactive {[round(x, 3) for x in ttfts]} s; a batch line {line_s:.3f} s")
        assert sorted(ttfts)[2] < line_s / 5, (ttfts, line_s, time.monotonic() - t0)
        httpx.post(f"{s.url}/v1/batches/{made['id']}/cancel", headers=auth("bob"))
