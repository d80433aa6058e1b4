"""The HTTP server's own limits, against a real `headrace serve` on 127.0.0.1: header size (431),
header and body deadlines (a half-sent request is dropped), a connection cap (503 at accept
time), and large chat bodies rendered off the event loop."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, serving, tiny_server_args

from headrace.api.prompts import MAX_CHAT_MESSAGES, encode_chat
from headrace.config import ServerConfig

TIMEOUT_S = 2.0  # the door server's header and body deadlines
CAP = 4  # the capped server's connection limit
SLOW_CLIENTS = 500
GENERATE = {"prompt": "Hello there", "max_tokens": 4, "temperature": 0}


def _start(model_dir: Path, tmp: Path, extra: list[str]) -> Iterator[Server]:
    for server in serving(tiny_server_args(model_dir) + extra, tmp):
        yield server
        assert "Traceback" not in server.log(), server.log()


@pytest.fixture(scope="module", params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest) -> str:
    """Every limit holds with either HTTP parser (`--http-parser`)."""
    return str(request.param)


@pytest.fixture(scope="module")
def door(
    api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, parser: str
) -> Iterator[Server]:
    """Default header size limit and connection cap, short deadlines."""
    timeouts = ["--header-timeout-s", str(TIMEOUT_S), "--body-timeout-s", str(TIMEOUT_S)]
    args = [*timeouts, "--http-parser", parser]
    yield from _start(api_model_dir, tmp_path_factory.mktemp(f"door-{parser}"), args)


@pytest.fixture(scope="module")
def capped(
    api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, parser: str
) -> Iterator[Server]:
    args = ["--max-connections", str(CAP), "--http-parser", parser]
    yield from _start(api_model_dir, tmp_path_factory.mktemp(f"capped-{parser}"), args)


@pytest.fixture(scope="module", autouse=True)
def enough_fds() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * SLOW_CLIENTS
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_to_eof(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _status_and_json(raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), json.loads(body), headers


def _open_fds(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def _healthy(server: Server) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("size", [20_000, 200_000])
def test_a_header_over_the_limit_gets_431_json(door: Server, size: int) -> None:
    # 20 kB arrives in one read (checked once parsed), 200 kB in several (refused incomplete)
    sock = _connect(door.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
    status, body, _ = _status_and_json(_read_to_eof(sock))
    sock.close()
    assert status == 431
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "16384 bytes" in body["error"]["message"]
    _healthy(door)


def test_a_header_under_the_limit_is_served(door: Server) -> None:
    r = httpx.get(door.url + "/health", headers={"x-big": "a" * 15_000}, timeout=10)
    assert r.status_code == 200


def _half_request(i: int) -> bytes:
    if i % 2:  # request line and some headers
        return (
            b"POST /v1/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        )
    body = json.dumps(GENERATE).encode()
    head = f"POST /v1/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body[: len(body) // 2]


def test_half_sent_requests_are_dropped_and_do_not_block_service(door: Server) -> None:
    _healthy(door)
    before = _open_fds(door)
    socks = []
    for i in range(SLOW_CLIENTS):
        sock = _connect(door.url)
        sock.sendall(_half_request(i))
        socks.append(sock)
    sent = time.monotonic()
    r = httpx.post(door.url + "/v1/generate", json=GENERATE, timeout=10)
    assert r.status_code == 200, r.text
    assert time.monotonic() - sent < TIMEOUT_S  # served while all of them were held
    answers = _read_all_to_eof(socks, deadline_s=TIMEOUT_S + 5.0)
    assert time.monotonic() - sent < TIMEOUT_S + 5.0
    for i, raw in enumerate(answers):
        status, body, _ = _status_and_json(raw)
        assert status == 408 and body["error"]["code"] == 408, (i, raw)
    for sock in socks:
        sock.close()
    _healthy(door)
    assert _wait_for_fds(door, before + 5) <= before + 5  # each dropped socket was closed


def _read_all_to_eof(socks: list[socket.socket], deadline_s: float) -> list[bytes]:
    """What each socket received until the server closed it; fails past the deadline."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, data=sock)
        got[sock] = b""
    end = time.monotonic() + deadline_s
    while sel.get_map() and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.5):
            sock = key.data
            chunk = sock.recv(65536)
            got[sock] += chunk
            if not chunk:
                sel.unregister(sock)
    assert not sel.get_map(), f"{len(sel.get_map())} half-sent requests still held"
    return [got[s] for s in socks]


def _wait_for_fds(server: Server, most: int, wait_s: float = 5.0) -> int:
    end = time.monotonic() + wait_s
    while (n := _open_fds(server)) > most and time.monotonic() < end:
        time.sleep(0.1)
    return n


def test_a_kept_alive_connection_that_stalls_mid_request_is_dropped(door: Server) -> None:
    sock = _connect(door.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # the next one, never finished
    t0 = time.monotonic()
    status, _, _ = _status_and_json(_read_to_eof(sock, timeout=TIMEOUT_S + 5))
    sock.close()
    assert status == 408 and time.monotonic() - t0 < TIMEOUT_S + 2


def test_connections_over_the_cap_get_503_and_service_continues_under_it(
    capped: Server,
) -> None:
    held = [_connect(capped.url) for _ in range(CAP)]
    try:
        r = httpx.post(capped.url + "/v1/generate", json=GENERATE, timeout=10)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "overloaded_error"
        held.pop().close()
        assert _first_status(capped, wait_s=3.0) == 200
    finally:
        for sock in held:
            sock.close()


def test_a_connection_over_the_cap_is_refused_at_once_and_holds_no_descriptor(
    capped: Server,
) -> None:
    held = [_connect(capped.url) for _ in range(CAP)]
    try:
        for sock in held:  # answered, so accepted and counted; then idle, kept alive for 30 s
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        before = _open_fds(capped)
        t0 = time.monotonic()
        extra = _connect(capped.url)  # sends nothing: the 503 does not wait for a request
        status, body, headers = _status_and_json(_read_to_eof(extra, timeout=10.0))
        waited = time.monotonic() - t0
        extra.close()
        assert status == 503 and headers["retry-after"] == "1", (status, body)
        assert body["error"]["type"] == "overloaded_error"
        assert waited < 3.0  # the answer and the close: the header timeout is 30 s
        idle = [_connect(capped.url) for _ in range(40)]  # open, unread, never closed by us
        try:
            assert _wait_for_fds(capped, before + 2, wait_s=5.0) <= before + 2
        finally:
            for sock in idle:
                sock.close()
        held.pop().close()
        assert _first_status(capped, wait_s=3.0) == 200
    finally:
        for sock in held:
            sock.close()


def _first_status(server: Server, wait_s: float) -> int:
    """The server notices a closed connection a moment later: retry 503s for a while."""
    end = time.monotonic() + wait_s
    while True:
        r = httpx.post(server.url + "/v1/generate", json=GENERATE, timeout=10)
        if r.status_code != 503 or time.monotonic() > end:
            return r.status_code
        time.sleep(0.05)


@pytest.mark.parametrize("count", [20_000, MAX_CHAT_MESSAGES])
def test_a_chat_of_many_messages_does_not_block_health(door: Server, count: int) -> None:
    messages = [{"role": "user", "content": ""}] * count
    body = json.dumps({"model": "tiny", "messages": messages}).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(base_url=door.url, timeout=10) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                c.get("/health")
                latencies.append(time.monotonic() - t0)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        with httpx.Client(base_url=door.url, timeout=30) as c:
            answers = [
                c.post("/v1/chat/completions", content=body, headers=headers) for _ in range(3)
            ]
    finally:
        stop.set()
        poller.join()
    assert all(400 <= r.status_code < 500 or r.status_code == 200 for r in answers)
    if count > MAX_CHAT_MESSAGES:
        assert [r.status_code for r in answers] == [400] * 3
        assert all(r.json()["error"]["param"] == "messages" for r in answers)
    # validating the 20,000 items of the body still runs on the loop (~0.2 s); rendering and
    # tokenizing do not, nor anything past the cap
    assert max(latencies) < 1.0, sorted(latencies)[-5:]


class _RecordingTokenizer:
    """Renders like a chat template would, noting the thread it ran on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
        self.threads.append(threading.get_ident())
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * len(text)


def test_many_short_messages_render_off_the_event_loop() -> None:
    tok = _RecordingTokenizer()
    messages = [{"role": "user", "content": ""}] * 1000  # no characters, much template work

    async def encode() -> int:
        await encode_chat(tok, messages)
        return threading.get_ident()

    loop_thread = asyncio.run(encode())
    assert tok.threads and tok.threads[0] != loop_thread


def test_front_door_settings_are_validated() -> None:
    bad_values: list[dict[str, Any]] = [
        {"header_timeout_s": 0}, {"body_timeout_s": -1}, {"max_connections": 0},
        {"http_parser": "picohttp"}, {"send_timeout_s": 0},
    ]  # fmt: skip
    for bad in bad_values:
        with pytest.raises(ValueError):
            ServerConfig(**bad)
