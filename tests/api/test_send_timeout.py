"""A client that stops reading its response is dropped after `--send-timeout-s` without
progress: against a real `headrace serve --tenants` on 127.0.0.1 (tiny model, a 4,096-token
context), raw sockets with a small receive buffer that never read. A stream's engine request is
aborted and its tenant's slot released; a large JSON answer no longer holds its connection (and
the megabytes buffered for it). `WriteWatch` itself on a fake transport."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import (
    Server,
    make_tiny_llama,
    read_metrics,
    serving,
    tiny_server_args,
    wait_for,
    write_tenants,
)

from headrace.api.write_watch import WriteWatch
from headrace.gateway.auth import hash_key

SEND_TIMEOUT_S = 2.0
CONTEXT = 4096
TENANTS = f"""
admin_key_sha256: [{hash_key("admin")}]
tenants:
  solo: {{tier: free, api_key_sha256: [{hash_key("solo-key")}], max_concurrent: 1}}
"""
SOLO = {"authorization": "Bearer solo-key"}
ADMIN = {"authorization": "Bearer admin"}
# about 1.5 kB an event: 4,000 tokens are ~6 MB, more than the kernel buffers on loopback
HUGE = {
    "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000,
    "ignore_eos": True, "logprobs": True, "top_logprobs": 20,
}  # fmt: skip
SMALL = {"model": "tiny", "prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp(f"send-{request.param}")
    model = make_tiny_llama(tmp / "tiny", max_positions=CONTEXT)
    args = tiny_server_args(model) + [
        "--max-model-len", str(CONTEXT), "--num-kv-blocks", "512",
        "--tenants", str(write_tenants(tmp, TENANTS)), "--send-timeout-s", str(SEND_TIMEOUT_S),
        "--http-parser", request.param,
    ]  # fmt: skip
    for s in serving(args, tmp):
        yield s
        assert "Traceback" not in s.log(), s.log()


def _never_reading(server: Server, body: dict[str, object]) -> socket.socket:
    """A chat completion sent on a socket with a 4 kB receive buffer that is never read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = server.url.removeprefix("http://").split(":")
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        "Authorization: Bearer solo-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _metric(server: Server, name: str) -> float:
    return read_metrics(server.url, ADMIN).get(name, 0.0)


def _engine_idle(server: Server) -> bool:
    stats = httpx.get(server.url + "/v1/stats", headers=ADMIN, timeout=10).json()
    tiny = stats["models"]["tiny"]["stats"]
    return bool(tiny["num_running"] == 0 and tiny["kv_blocks_used"] == 0)


def _solo_status(server: Server) -> int:
    r = httpx.post(server.url + "/v1/completions", json=SMALL, headers=SOLO, timeout=30)
    return r.status_code


def _closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Reads what reached the socket; True once the server has closed (reset) it."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_a_stream_nobody_reads_is_dropped_aborted_and_its_slot_released(server: Server) -> None:
    dropped = _metric(server, "headrace:http_send_timeouts_total")
    aborted = _metric(
        server, 'headrace:request_success_total{finish_reason="abort",model_name="tiny"}'
    )
    sock = _never_reading(server, {**HUGE, "stream": True})
    try:
        wait_for(lambda: not _engine_idle(server), 30, "the stream to start")
        assert _solo_status(server) == 429  # its one slot is the stream's
        t0 = time.monotonic()
        wait_for(lambda: _solo_status(server) == 200, 60, "the tenant's slot to come back")
        freed_after = time.monotonic() - t0
        assert _closed_by_server(sock)
    finally:
        sock.close()
    wait_for(lambda: _engine_idle(server), 10, "no request running and no KV block held")
    assert _metric(server, "headrace:http_send_timeouts_total") == dropped + 1
    # the stream stopped where its client stopped: the rest of it was aborted, not generated
    abort = 'headrace:request_success_total{finish_reason="abort",model_name="tiny"}'
    assert _metric(server, abort) == aborted + 1, f"slot back after {freed_after:.1f} s"


def _holds(server: Server, sock: socket.socket) -> bool:
    """Whether the server has a descriptor open on the far end of `sock`."""
    port = sock.getsockname()[1]
    ends = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    inodes = {f"socket:[{e[9]}]" for e in ends if int(e[2].split(":")[1], 16) == port}
    fd_dir = f"/proc/{server.proc.pid}/fd"
    return any(os.readlink(f"{fd_dir}/{fd}") in inodes for fd in os.listdir(fd_dir))


def test_a_large_answer_nobody_reads_does_not_hold_its_connection(server: Server) -> None:
    dropped = _metric(server, "headrace:http_send_timeouts_total")
    sock = _never_reading(server, {**HUGE, "n": 4, "max_tokens": 1600})  # ~8 MB of JSON
    try:
        wait_for(lambda: not _engine_idle(server), 30, "the request to start")
        wait_for(lambda: _engine_idle(server), 60, "the request to finish")
        # the answer sits in the server's buffers until dropped: it used to be held for good
        wait_for(lambda: not _holds(server, sock), SEND_TIMEOUT_S + 20, "the connection's end")
        assert _metric(server, "headrace:http_send_timeouts_total") == dropped + 1
        assert _closed_by_server(sock)
    finally:
        sock.close()
    assert _solo_status(server) == 200


class _Buffer:
    """A transport's write buffer, as much of it as WriteWatch reads."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_write_buffer_size(self) -> int:
        return self.size


def test_write_watch_expires_without_progress_and_not_while_the_client_reads() -> None:
    async def watch(reads: int, resume: bool = False) -> float | None:
        loop = asyncio.get_running_loop()
        expired: list[float] = []
        buffer = _Buffer(100_000)
        w = WriteWatch(loop, buffer, 0.05, lambda: expired.append(loop.time()))  # type: ignore[arg-type]
        t0 = loop.time()
        w.paused()
        for _ in range(reads):  # the client takes a little each period
            await asyncio.sleep(0.03)
            buffer.size -= 1000
        if resume:
            w.resumed()
        await asyncio.sleep(0.2)
        w.stop()
        return expired[0] - t0 if expired else None

    assert asyncio.run(watch(0)) is not None  # nothing read: expired
    late = asyncio.run(watch(6))  # read for 0.18 s, then stopped: expired after that
    assert late is not None and late > 0.18
    assert asyncio.run(watch(3, resume=True)) is None  # drained below the low mark
