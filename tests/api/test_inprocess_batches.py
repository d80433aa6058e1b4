"""The Batch API's routes in process, over a scripted engine: a file uploaded, read, listed and
deleted; a batch made of it runs its lines through the completions route as the tenant's
batch-tier requests and ends completed with its output file; another tenant sees none of it
(404); bad uploads and bad batches are 400s naming what is wrong; without a batch directory
every route is a 404. (The real server, the SDK, cancel and restart: tests/batches/.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_engine import ScriptEngine, text_chunks
from starlette.types import Receive, Scope, Send

from api.inprocess import make_app, script_engine, session
from api.route_coverage import covers
from api.test_inprocess_ledger import ACME, ADMIN, gateway, metric
from headrace.api.batch_call import call
from headrace.batches import service
from headrace.config import BatchConfig, ServerConfig
from headrace.engine.frontend.client import GenerationChunk
from headrace.ledger.writer import Ledger
from headrace.request import FinishReason

BOB = {"authorization": "Bearer bob-key"}
LINES = [
    {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
     "body": {"model": "m", "prompt": f"Hi {i}", "max_tokens": 4}}
    for i in range(3)
]  # fmt: skip


def jsonl(lines: list[Any]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def upload(
    c: httpx.AsyncClient, data: bytes, headers: dict[str, str], purpose: str = "batch"
) -> Awaitable[httpx.Response]:
    files = {"file": ("in.jsonl", data, "application/jsonl")}
    return c.post("/v1/files", files=files, data={"purpose": purpose}, headers=headers)


async def finished(c: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    for _ in range(400):
        batch: dict[str, Any] = (await c.get(f"/v1/batches/{batch_id}", headers=ACME)).json()
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        await asyncio.sleep(0.01)
    raise AssertionError(f"batch {batch_id} did not finish: {batch}")


@covers(
    "POST /v1/files", "GET /v1/files", "GET /v1/files/{file_id}",
    "GET /v1/files/{file_id}/content", "DELETE /v1/files/{file_id}", "POST /v1/batches",
    "GET /v1/batches", "GET /v1/batches/{batch_id}", "POST /v1/batches/{batch_id}/cancel",
)  # fmt: skip
def test_a_batch_runs_its_lines_as_the_tenants_batch_tier(tmp_path: Path) -> None:
    engine = script_engine()
    app = make_app(engine, gateway(tmp_path), batch=BatchConfig(batch_dir=str(tmp_path / "b")))
    bad_line = {**LINES[0], "custom_id": "bad", "body": {"model": "m", "prompt": "x",
                                                          "max_tokens": 10_000}}  # fmt: skip

    async def work(c: httpx.AsyncClient) -> dict[str, Any]:
        f = (await upload(c, jsonl([*LINES, bad_line]), ACME)).json()
        assert f["object"] == "file" and f["purpose"] == "batch", f
        assert (await c.get(f"/v1/files/{f['id']}", headers=ACME)).json() == f
        assert (await c.get(f"/v1/files/{f['id']}/content", headers=ACME)).content.count(b"\n") == 4
        body = {"input_file_id": f["id"], "endpoint": "/v1/completions",
                "completion_window": "24h", "metadata": {"job": "nightly"}}  # fmt: skip
        made = (await c.post("/v1/batches", json=body, headers=ACME)).json()
        assert made["status"] == "validating" and made["metadata"] == {"job": "nightly"}, made
        done = await finished(c, made["id"])
        again = (await c.post(f"/v1/batches/{made['id']}/cancel", headers=ACME)).json()
        assert again["status"] == "completed"  # an ended batch stays as it ended
        listed = (await c.get("/v1/batches", headers=ACME)).json()
        assert [b["id"] for b in listed["data"]] == [made["id"]]
        out = (await c.get(f"/v1/files/{done['output_file_id']}/content", headers=ACME)).text
        err = (await c.get(f"/v1/files/{done['error_file_id']}/content", headers=ACME)).text
        names = {x["filename"] for x in (await c.get("/v1/files", headers=ACME)).json()["data"]}
        assert names == {"in.jsonl", f"{made['id']}_output.jsonl", f"{made['id']}_error.jsonl"}
        for path in (f"/v1/files/{f['id']}", f"/v1/batches/{made['id']}"):  # bob: no such thing
            assert (await c.get(path, headers=BOB)).status_code == 404
        assert (await c.post(f"/v1/batches/{made['id']}/cancel", headers=BOB)).status_code == 404
        assert (await c.delete(f"/v1/files/{f['id']}", headers=BOB)).status_code == 404
        assert (await c.get("/v1/files", headers=BOB)).json()["data"] == []
        deleted = (await c.delete(f"/v1/files/{f['id']}", headers=ACME)).json()
        assert deleted == {"id": f["id"], "object": "file", "deleted": True}
        assert (await c.get(f"/v1/files/{f['id']}", headers=ACME)).status_code == 404
        return {"done": done, "out": out, "err": err}

    got = session(app, work)
    done = got["done"]
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    out = [json.loads(x) for x in got["out"].splitlines()]
    assert [x["custom_id"] for x in out] == ["r0", "r1", "r2"]
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert out[0]["response"]["body"]["choices"][0]["text"] == "Hello there"
    (err,) = [json.loads(x) for x in got["err"].splitlines()]
    assert err["custom_id"] == "bad" and err["response"]["status_code"] == 400
    assert "max_tokens" in err["error"]["message"] or err["error"]["code"]
    assert {(r.options.tenant, r.options.priority) for r in engine.requests if r.options} == {
        ("acme", 2)  # acme is paid (priority 0): its batch lines run at the batch tier's 2
    }


def test_bad_uploads_and_batches_are_400s_that_say_why(tmp_path: Path) -> None:
    cfg = BatchConfig(batch_dir=str(tmp_path / "b"), batch_max_lines=4)
    app = make_app(script_engine(), gateway(tmp_path), ServerConfig(max_body_bytes=400), batch=cfg)
    broken = jsonl(LINES[:1]) + b"{not json\n"
    wrong_url = jsonl([LINES[0], {**LINES[1], "url": "/v1/embeddings"}])

    async def work(c: httpx.AsyncClient) -> list[httpx.Response]:
        out = [await upload(c, broken, ACME), await upload(c, wrong_url, ACME)]
        out.append(await upload(c, jsonl([*LINES, LINES[0]]), ACME))  # custom_id twice
        many = [{**LINES[0], "custom_id": f"m{i}"} for i in range(5)]
        out.append(await upload(c, jsonl(many), ACME))  # over --batch-max-lines
        long = {**LINES[1], "body": {"prompt": "x" * 400}}
        out.append(await upload(c, jsonl([LINES[0], long]), ACME))  # over the body limit
        out.append(await upload(c, jsonl(LINES), ACME, purpose="fine-tune"))
        out.append(await c.post("/v1/files", json={"file": "x"}, headers=ACME))
        chat_file = (await upload(c, jsonl(LINES), ACME)).json()["id"]
        body = {"input_file_id": chat_file, "endpoint": "/v1/chat/completions",
                "completion_window": "24h"}  # fmt: skip
        out.append(await c.post("/v1/batches", json=body, headers=ACME))
        out.append(await c.post("/v1/batches", json={**body, "completion_window": "1h"},
                                headers=ACME))  # fmt: skip
        out.append(await c.post("/v1/batches", json={**body, "input_file_id": "file-x"},
                                headers=ACME))  # fmt: skip
        out.append(await c.get("/v1/files", headers={}))
        return out

    answers = session(app, work)
    statuses = [r.status_code for r in answers]
    assert statuses == [400] * 9 + [404, 401], [r.text for r in answers]
    messages = [r.json()["error"]["message"] for r in answers]
    assert messages[0].startswith("line 2: not valid JSON"), messages[0]
    assert messages[1].startswith("line 2: url must be one of"), messages[1]
    assert "custom_id 'r0' is used twice" in messages[2] and "line 4" in messages[2]
    assert messages[3] == "line 5: the file has more than 4 requests"
    assert messages[4] == "line 2: longer than the limit of 400 bytes"
    assert messages[5].startswith("purpose must be")
    assert answers[6].json()["error"]["param"] in ("file", "purpose"), messages[6]
    assert "line 1: url /v1/completions is not the batch's endpoint" in messages[7]
    assert answers[8].json()["error"]["param"] == "completion_window"
    assert answers[9].json()["error"]["param"] == "input_file_id"


def test_without_a_batch_directory_the_routes_are_404(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    for where in ("off", str(tmp_path / "a-file")):  # off, or it cannot be opened (logged)
        engine: ScriptEngine = script_engine()
        app = make_app(engine, batch=BatchConfig(batch_dir=where))

        async def work(c: httpx.AsyncClient) -> list[int]:
            paths = ("/v1/batches", "/v1/files", "/v1/models")
            return [(await c.get(path)).status_code for path in paths]

        assert session(app, work) == [404, 404, 200]


def test_the_admin_sees_every_batch_and_its_cancel_is_audited(tmp_path: Path) -> None:
    slow = script_engine([0.2, *text_chunks(["Hello", " there"])])
    cfg = BatchConfig(batch_dir=str(tmp_path / "b"), batch_concurrency=1)
    ledger = Ledger(tmp_path / "l.db", flush_s=60)
    app = make_app(slow, gateway(tmp_path), ledger=ledger, batch=cfg)
    lines = [{**LINES[0], "custom_id": f"s{i}"} for i in range(20)]

    async def work(c: httpx.AsyncClient) -> dict[str, Any]:
        f = (await upload(c, jsonl(lines), ACME)).json()
        body = {"input_file_id": f["id"], "endpoint": "/v1/completions",
                "completion_window": "24h"}  # fmt: skip
        made = (await c.post("/v1/batches", json=body, headers=ACME)).json()
        seen = (await c.get(f"/v1/batches/{made['id']}", headers=ADMIN)).json()
        listed = (await c.get("/v1/batches", headers=ADMIN)).json()["data"]
        cancel = await c.post(f"/v1/batches/{made['id']}/cancel", headers=ADMIN)
        done = await finished(c, made["id"])
        audit = (await c.get("/v1/audit", headers=ADMIN)).json()["data"]
        files = await c.get(f"/v1/files/{f['id']}", headers=ADMIN)  # files: their owner's
        metrics = (await c.get("/metrics", headers=ADMIN)).text
        return {"seen": seen, "listed": listed, "cancel": cancel, "done": done, "audit": audit,
                "files": files.status_code, "metrics": metrics}  # fmt: skip

    got = session(app, work)
    assert got["seen"]["id"] == got["done"]["id"] and [b["id"] for b in got["listed"]] == [
        got["done"]["id"]
    ]
    assert got["cancel"].json()["status"] in ("cancelling", "cancelled")
    assert got["done"]["status"] == "cancelled"
    assert got["done"]["request_counts"]["completed"] < 20
    (entry,) = got["audit"]
    assert (entry["action"], entry["arguments"]) == (
        "batch.cancel",
        {"batch_id": got["done"]["id"]},
    )
    assert got["files"] == 401
    completed = got["done"]["request_counts"]["completed"]
    assert metric(got["metrics"], 'headrace:batch_lines_total{outcome="completed"}') == completed
    assert metric(got["metrics"], "headrace:batches_running") == 0
    assert metric(got["metrics"], "headrace:batch_lines_running") == 0


def test_a_line_refused_for_now_is_tried_again(tmp_path: Path) -> None:
    """A queue deadline passed (503) is no failure for a batch line: it runs again, and the
    output holds its answer."""
    tries: list[str] = []

    def script(request: object) -> list[GenerationChunk | BaseException | float]:
        tries.append("x")
        if len(tries) == 1:
            return [GenerationChunk("", "", [], FinishReason.OVERLOADED, 3, error="too late")]
        return list(text_chunks(["Hello", " there"]))

    cfg = BatchConfig(batch_dir=str(tmp_path / "b"))
    app = make_app(script_engine(script), gateway(tmp_path), batch=cfg)

    async def work(c: httpx.AsyncClient) -> tuple[dict[str, Any], str]:
        f = (await upload(c, jsonl(LINES[:1]), ACME)).json()
        body = {"input_file_id": f["id"], "endpoint": "/v1/completions",
                "completion_window": "24h"}  # fmt: skip
        made = (await c.post("/v1/batches", json=body, headers=ACME)).json()
        done = await finished(c, made["id"])
        out = await c.get(f"/v1/files/{done['output_file_id']}/content", headers=ACME)
        return done, out.text

    done, out = session(app, work)
    assert len(tries) == 2 and done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert json.loads(out)["response"]["body"]["choices"][0]["text"] == "Hello there"


def test_a_route_that_crashes_answers_the_line_500() -> None:
    async def crashing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    status, body = asyncio.run(call(crashing, "/v1/completions", b"{}", {}))
    assert status == 500 and "boom" in json.loads(body)["error"]["message"]


def test_lines_past_the_window_expire_into_the_error_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "WINDOW_S", {"24h": 0})  # a window that has ended at once
    engine = script_engine()
    app = make_app(engine, gateway(tmp_path), batch=BatchConfig(batch_dir=str(tmp_path / "b")))

    async def work(c: httpx.AsyncClient) -> tuple[dict[str, Any], str]:
        f = (await upload(c, jsonl(LINES), ACME)).json()
        body = {"input_file_id": f["id"], "endpoint": "/v1/completions",
                "completion_window": "24h"}  # fmt: skip
        made = (await c.post("/v1/batches", json=body, headers=ACME)).json()
        done = await finished(c, made["id"])
        err = await c.get(f"/v1/files/{done['error_file_id']}/content", headers=ACME)
        return done, err.text

    done, err = session(app, work)
    assert done["status"] == "expired" and done["expired_at"] and done["output_file_id"] is None
    assert done["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    lines = [json.loads(x) for x in err.splitlines()]
    assert [(x["custom_id"], x["error"]["code"], x["response"]) for x in lines] == [
        (f"r{i}", "batch_expired", None) for i in range(3)
    ]
    assert engine.requests == []  # none ran
