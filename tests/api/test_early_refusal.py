"""Refusals that need no body come before the body is read: a request the gateway refuses from
its headers (no key, the tenant at its concurrency limit, the queue full) is refused even when
its body is not valid JSON — proof that nothing parsed it — and always with Retry-After on a
503. Real `headrace serve --tenants`, tiny model, 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args, write_tenants

from headrace.gateway.auth import hash_key

TENANTS = f"""
admin_key_sha256: [{hash_key("admin")}]
tenants:
  solo: {{tier: free, api_key_sha256: [{hash_key("solo-key")}], max_concurrent: 1}}
  many: {{tier: free, api_key_sha256: [{hash_key("many-key")}]}}
"""
BROKEN = b'{"prompt": "never parsed'
LONG = {"prompt": "Hello there", "max_tokens": 400, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("early")
    args = tiny_server_args(make_tiny_llama(tmp / "tiny")) + [
        "--tenants", str(write_tenants(tmp, TENANTS)), "--max-num-seqs", "1",
        "--max-queued-requests", "1",
    ]  # fmt: skip
    yield from serving(args, tmp)


def _broken(server: Server, key: str | None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(server.url + "/v1/completions", content=BROKEN, headers=headers, timeout=30)


class _Holder:
    """A streaming request held open in a thread until `release`."""

    def __init__(self, server: Server, key: str) -> None:
        self.started = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, key), daemon=True)
        self._thread.start()

    def _run(self, server: Server, key: str) -> None:
        headers = {"authorization": f"Bearer {key}"}
        with httpx.stream(
            "POST", server.url + "/v1/generate", json=LONG, headers=headers, timeout=60
        ) as r:
            for _ in r.iter_lines():
                self.started.set()
                if self.done.is_set():
                    return

    def release(self) -> None:
        self.done.set()
        self._thread.join(30)


def test_no_key_is_a_401_before_the_body(server: Server) -> None:
    r = _broken(server, None)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["type"] == "authentication_error"


def test_without_pressure_a_broken_body_is_a_400(server: Server) -> None:
    assert _broken(server, "many-key").status_code == 400


def test_concurrency_limit_is_a_429_before_the_body(server: Server) -> None:
    holder = _Holder(server, "solo-key")
    try:
        assert holder.started.wait(30)
        r = _broken(server, "solo-key")
        assert r.status_code == 429, r.text
        assert "retry-after" in r.headers
    finally:
        holder.release()


def test_full_queue_is_a_503_with_retry_after_before_the_body(server: Server) -> None:
    running = _Holder(server, "many-key")
    assert running.started.wait(30)
    queued = threading.Thread(
        target=lambda: httpx.post(
            server.url + "/v1/generate",
            json={**LONG, "stream": False, "max_tokens": 2},
            headers={"authorization": "Bearer many-key"},
            timeout=60,
        ),  # fmt: skip
        daemon=True,
    )
    queued.start()
    try:
        for _ in range(100):  # the queued request reaches the gateway's queue
            r = _broken(server, "many-key")
            if r.status_code == 503:
                break
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "overloaded_error"
    finally:
        running.release()
        queued.join(60)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
