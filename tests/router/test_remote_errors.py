"""What a tenant hears when a `--replica-url` server fails its request: a 502 with one generic
message, never the replica's address or the text it answered with (which may tell of other
tenants); the operator finds both in the front end's log.

The replica is a stand-in on 127.0.0.1 (a thread of this process): it answers the stats, the
tokenizer and aborts as a `headrace serve` would, and misbehaves on each request: a 500 that
names an internal address and another tenant, a dropped connection, or a stream that is not
JSON. The front end is a real `headrace serve --replicas 0 --replica-url ...`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, running, serve_args, wait_for

from headrace.loader.tokenizer import load_tokenizer
from headrace.router.attempt import REPLICA_FAILED

LEAK = "tenant acme has 7 requests queued at http://10.0.0.5:9000"


class Misbehaving(BaseHTTPRequestHandler):
    """A replica whose generate fails as `server.mode` says; the rest it answers well."""

    server: StandIn

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/v1/stats"):
            self._json(200, {"models": {"alpha": {"max_model_len": 512, "healthy": True,
                                                  "stats": {}}}})  # fmt: skip
        else:
            self._json(200, self.server.tokenizer)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        mode = self.server.mode
        if self.path != "/v1/replica/generate":
            self._json(200, {})
        elif mode == "500":
            message = f"{LEAK}; replica http://127.0.0.1:{self.server.server_port}/ failed"
            self._json(500, {"error": {"message": message}})
        elif mode == "garbage":
            self._send(200, b"data: {not json at http://127.0.0.1\n\n", "text/event-stream")
        else:  # "drop": no answer at all
            self.close_connection = True

    def _json(self, status: int, body: object) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, tokenizer: dict[str, Any]) -> None:
        super().__init__(("127.0.0.1", 0), Misbehaving)
        self.tokenizer = tokenizer
        self.mode = "500"


@pytest.fixture(scope="module")
def stand_in(tiny_models: dict[str, Path]) -> Iterator[StandIn]:
    tok = load_tokenizer(tiny_models["alpha"])
    answer = {"tokenizer": tok.backend.to_str(), "config": tok.config,
              "architecture": tok.architecture}  # fmt: skip
    server = StandIn(answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def front(stand_in: StandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    url = f"http://127.0.0.1:{stand_in.server_port}"
    args = serve_args(extra=("--replicas", "0", "--replica-url", url))
    with running(args, tmp_path_factory.mktemp("remote-errors")) as s:
        yield s


@pytest.mark.parametrize("mode", ["500", "drop", "garbage"])
def test_a_failing_remote_replica_is_a_generic_502(
    front: Server, stand_in: StandIn, mode: str
) -> None:
    wait_for(lambda: httpx.get(front.url + "/health", timeout=10).status_code == 200, 30,
             "the replica back in rotation")  # fmt: skip
    stand_in.mode = mode
    body = {"model": "alpha", "prompt": "hello there", "max_tokens": 4}
    r = httpx.post(front.url + "/v1/generate", json=body, timeout=60)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert (error["message"], error["type"], error["code"]) == (REPLICA_FAILED, "server_error", 502)
    assert "127.0.0.1" not in r.text and "http" not in r.text and "acme" not in r.text
    address = f"127.0.0.1:{stand_in.server_port}"
    wait_for(lambda: address in front.log(), 10, "the replica's address in the log")
