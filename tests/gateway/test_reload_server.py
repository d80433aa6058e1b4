"""Reloading the tenants file without a restart, against real `headrace serve` processes on
127.0.0.1 (tiny model): SIGHUP and `POST /admin/reload` swap keys and limits at once, refuse a
bad file (the old one stays), leave a stream in flight alone and never stop the server; the
admin key comes from a file or the environment, out of the process list."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import (
    Server,
    free_port,
    make_tiny_llama,
    read_metrics,
    serving,
    sse_events,
    tiny_server_args,
    wait_for,
)

from headrace.gateway.auth import hash_key
from headrace.gateway.tenants import TenantsFileError, load_tenants

ADMIN = "admin-from-file"
ENV_ADMIN = "admin-from-env"


def tenants_text(**tenants: dict[str, Any]) -> str:
    """A tenants file: each tenant's keys in clear under `keys`, hashed here."""
    lines = ["tenants:"]
    for name, spec in tenants.items():
        fields = {k: v for k, v in spec.items() if k != "keys"}
        fields["api_key_sha256"] = [hash_key(k) for k in spec["keys"]]
        lines.append(f"  {name}: {json.dumps(fields)}")
    return "\n".join(lines) + "\n"


FIRST = tenants_text(acme={"keys": ["acme-key"], "max_concurrent": 1}, bob={"keys": ["bob-key"]})


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def generate(server: Server, key: str, max_tokens: int = 2) -> httpx.Response:
    body = {"prompt": "Hello there", "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(server.url + "/v1/generate", json=body, headers=auth(key), timeout=60)


def hang_up(server: Server, line: str) -> None:
    """SIGHUP, then wait until the log has one more `line` than before: the reload is done."""
    seen = server.log().count(line)
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: server.log().count(line) > seen or server.proc.poll() is not None, 30, line)
    assert server.proc.poll() is None, f"SIGHUP stopped the server:\n{server.log()}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("reload-model") / "tiny")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("reload-files")
    tenants, key = tmp / "tenants.yaml", tmp / "admin.key"
    tenants.write_text(FIRST)
    key.write_text(ADMIN + "\n")
    key.chmod(0o600)
    return tenants, key


@pytest.fixture(scope="module")
def server(
    model: Path, files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tenants, key = files
    args = tiny_server_args(model) + ["--tenants", str(tenants), "--admin-key-file", str(key)]
    yield from serving(args, tmp_path_factory.mktemp("reload-server"))


@pytest.fixture
def tenants(server: Server, files: tuple[Path, Path]) -> Iterator[Path]:
    """The served tenants file, put back to FIRST (and reloaded) after the test."""
    yield files[0]
    files[0].write_text(FIRST)
    files[1].write_text(ADMIN)
    hang_up(server, "reloaded:")


async def _stream(url: str, key: str, first: asyncio.Event, go: asyncio.Event) -> list[str]:
    """A long stream (sampled, so not speculated) that sets `first` at its first event and
    reads no further until `go`: its ~300 KB (logprobs) fill the socket buffers, so the server
    holds it open meanwhile, however fast the tiny model is."""
    body = {"model": "tiny", "prompt": "a", "max_tokens": 480, "ignore_eos": True,
            "stream": True, "temperature": 1.0, "logprobs": 20}  # fmt: skip
    lines = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json=body, headers=auth(key)) as r,
    ):
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            lines.append(line)
            if not first.is_set():
                first.set()
                await go.wait()
    return sse_events(lines)


def finished(events: list[str]) -> str:
    """The finish reason of a completed stream (its last event before [DONE])."""
    assert events[-1] == "[DONE]", events[-3:]
    reason: str = json.loads(events[-2])["choices"][0]["finish_reason"]
    return reason


def in_flight(server: Server, tenant: str) -> float:
    m = read_metrics(server.url, auth(ADMIN))
    return m.get(f'headrace:gateway_requests_in_flight{{tenant="{tenant}",tier="free"}}', 0.0)


def test_sighup_adds_and_revokes_keys_and_changes_limits(server: Server, tenants: Path) -> None:
    async def scenario() -> None:
        assert generate(server, "acme-key").status_code == 200
        assert generate(server, "carol-key").status_code == 401
        first, go = asyncio.Event(), asyncio.Event()
        held = asyncio.create_task(_stream(server.url, "acme-key", first, go))
        await asyncio.wait_for(first.wait(), 60)
        assert generate(server, "acme-key").status_code == 429  # max_concurrent 1
        tenants.write_text(
            tenants_text(acme={"keys": ["acme-key"], "max_concurrent": 2},
                         carol={"keys": ["carol-key"]})
        )  # fmt: skip
        hang_up(server, "reloaded:")
        assert in_flight(server, "acme") == 1  # the held stream is still open
        again = generate(server, "acme-key")
        assert again.status_code == 200, again.text  # 2 in flight are allowed now
        assert generate(server, "carol-key").status_code == 200  # added
        revoked = generate(server, "bob-key")  # removed
        assert revoked.status_code == 401, revoked.text
        assert revoked.json()["error"]["message"] == "invalid API key"
        go.set()
        assert finished(await held) == "length"

    asyncio.run(scenario())
    assert "added carol" in server.log() and "1 keys added, 1 revoked" in server.log()


def test_a_stream_across_a_reload_finishes(server: Server, tenants: Path) -> None:
    async def scenario() -> list[str]:
        first, go = asyncio.Event(), asyncio.Event()
        held = asyncio.create_task(_stream(server.url, "bob-key", first, go))
        await asyncio.wait_for(first.wait(), 60)
        tenants.write_text(tenants_text(acme={"keys": ["acme-key"]}))  # bob revoked
        hang_up(server, "reloaded:")
        assert in_flight(server, "bob") == 1
        go.set()
        return await held

    events = asyncio.run(scenario())
    assert finished(events) == "length"
    tokens = sum(len(json.loads(e)["choices"][0]["logprobs"]["tokens"]) for e in events[:-1])
    assert tokens == 480  # every token, after the reload too
    assert in_flight(server, "bob") == 0  # released as usual
    assert generate(server, "bob-key").status_code == 401  # the next request of bob's


def test_a_bad_file_on_sighup_keeps_the_old_tenants(server: Server, tenants: Path) -> None:
    tenants.write_text(FIRST.replace('max_concurrent": 1', 'max_concurrent": -5'))
    with pytest.raises(TenantsFileError) as at_start:
        load_tenants(tenants)
    hang_up(server, "reload refused")
    assert str(at_start.value) in server.log()  # the message a start would give
    assert "max_concurrent: expected a positive integer, got -5" in server.log()
    assert generate(server, "acme-key").status_code == 200
    assert generate(server, "bob-key").status_code == 200


def test_the_admin_reload_route(server: Server, tenants: Path, files: tuple[Path, Path]) -> None:
    url = server.url + "/admin/reload"
    for headers in ({}, auth("acme-key"), auth("wrong")):
        r = httpx.post(url, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    tenants.write_text("tenants: {acme: {api_key_sha256: [sk-in-clear]}}\n")
    bad = httpx.post(url, headers=auth(ADMIN), timeout=30)
    assert bad.status_code == 400, bad.text
    with pytest.raises(TenantsFileError) as at_start:
        load_tenants(tenants)
    assert bad.json()["error"]["message"] == str(at_start.value)
    assert generate(server, "bob-key").status_code == 200  # the old file stays
    tenants.write_text(tenants_text(acme={"keys": ["acme-key", "acme-key-2"]}))
    files[1].write_text("rotated-admin\n")  # the admin key file is read again too
    ok = httpx.post(url, headers=auth(ADMIN), timeout=30)
    assert ok.status_code == 200, ok.text
    summary = ok.json()
    assert summary["reloaded"] is True and summary["tenants"] == 1
    assert summary["tenants_removed"] == ["bob"] and summary["tenants_changed"] == ["acme"]
    assert (summary["keys_added"], summary["keys_revoked"]) == (1, 1)
    assert generate(server, "acme-key-2").status_code == 200
    assert generate(server, "bob-key").status_code == 401
    assert httpx.post(url, headers=auth(ADMIN), timeout=30).status_code == 401  # rotated away
    assert httpx.post(url, headers=auth("rotated-admin"), timeout=30).status_code == 200


def test_the_admin_key_file_stays_out_of_the_process_list(server: Server) -> None:
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert b"--admin-key-file" in cmdline and ADMIN.encode() not in cmdline
    assert httpx.get(server.url + "/metrics", headers=auth(ADMIN)).status_code == 200
    assert httpx.get(server.url + "/metrics", headers=auth("acme-key")).status_code == 401


def test_the_admin_key_from_the_environment(
    model: Path, files: tuple[Path, Path], tmp_path: Path
) -> None:
    args = tiny_server_args(model) + ["--tenants", str(files[0])]
    for srv in serving(args, tmp_path, env={"HEADRACE_ADMIN_KEY": ENV_ADMIN}):
        assert ENV_ADMIN.encode() not in Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes()
        assert httpx.get(srv.url + "/metrics", headers=auth(ENV_ADMIN)).status_code == 200
        assert httpx.get(srv.url + "/metrics").status_code == 401


def test_two_admin_key_sources_are_refused(files: tuple[Path, Path]) -> None:
    cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(free_port()),
           "--tenants", str(files[0]), "--admin-key-file", str(files[1])]  # fmt: skip
    env = {**os.environ, "HEADRACE_ADMIN_KEY": ENV_ADMIN}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--admin-key-file, HEADRACE_ADMIN_KEY are all set" in done.stderr


def engine_pid(server: Server) -> int:
    pid: int = httpx.get(server.url + "/health", timeout=10).json()["replicas"]["tiny"][0]["pid"]
    return pid


def test_sighup_without_tenants_keeps_serving(model: Path, tmp_path: Path) -> None:
    for srv in serving(tiny_server_args(model), tmp_path):
        hang_up(srv, "nothing to reload")
        assert generate(srv, "any").status_code == 200
        # A hangup of the whole process group reaches the engine process too: it stays.
        core = engine_pid(srv)
        os.kill(core, signal.SIGHUP)
        for _ in range(5):
            assert generate(srv, "any").status_code == 200
        assert engine_pid(srv) == core and "restart" not in srv.log().lower()
        r = httpx.post(srv.url + "/admin/reload", timeout=30)
        assert r.status_code == 404 and "admin routes are off" in r.json()["error"]["message"]
