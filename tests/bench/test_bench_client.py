"""The benchmark's streaming client (aiohttp) against the stub server and against servers that
fail in each way it names: an error answer, a refused connection, a stream cut short, silence."""

from __future__ import annotations

import asyncio

import pytest
from factories import free_port

from headrace.bench.client import Target, make_client, send
from headrace.bench.stats import RequestResult
from headrace.bench.workloads import RequestSpec

SPEC = RequestSpec(index=0, prompt="a b c", prompt_words=3, max_tokens=5)


def one(target: Target, spec: RequestSpec = SPEC) -> RequestResult:
    async def go() -> RequestResult:
        async with make_client(target) as client:
            return await send(client, target, spec, 0.0)

    return asyncio.run(go())


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_a_stream_is_timed_and_counted_from_usage(stub_server, api: str) -> None:
    url, stub = stub_server(token_delay=0.01)
    result = one(Target(url, api=api))
    assert result.ok and result.status == 200 and result.error is None
    assert result.output_tokens == 5 and result.tokens_from_usage and result.prompt_tokens == 3
    assert result.text == " w0 w1 w2 w3 w4"
    assert result.ttft is not None and 0.005 < result.ttft < result.e2e
    assert len(result.itl) == 4 and all(gap > 0.005 for gap in result.itl)
    assert stub.generated == 5


def test_an_error_answer_keeps_its_type_and_message(stub_server) -> None:
    url, _ = stub_server(fail_status=503)
    result = one(Target(url))
    assert not result.ok and result.status == 503
    assert (result.error, result.message) == ("server_error", "the stub is told to fail")


def test_a_refused_connection_is_a_connect_error() -> None:
    result = one(Target(f"http://127.0.0.1:{free_port()}"))
    assert not result.ok and result.status is None and result.error == "connect_error"


async def _cut_server(body: bytes) -> tuple[asyncio.Server, str]:
    """Answers 200 with a chunked event stream, sends `body` as one chunk, then hangs up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _against_cut_server(body: bytes) -> RequestResult:
    async def go() -> RequestResult:
        server, url = await _cut_server(body)
        async with server:
            target = Target(url)
            async with make_client(target) as client:
                return await send(client, target, SPEC, 0.0)

    return asyncio.run(go())


def test_a_stream_cut_short_is_a_protocol_error() -> None:
    result = _against_cut_server(b'data: {"choices": [{"text": " w0"}]}\n\n')
    assert not result.ok and result.status == 200 and result.error == "protocol_error"


def test_an_unparseable_event_is_a_bad_event() -> None:
    result = _against_cut_server(b"data: {not json\n\n")
    assert not result.ok and result.error == "bad_event"


def test_silence_past_the_timeout_is_a_timeout(stub_server) -> None:
    url, _ = stub_server(token_delay=2.0)
    result = one(Target(url, timeout=0.3))
    assert not result.ok and result.error == "timeout"


def test_a_stream_longer_than_the_timeout_is_fine_while_bytes_keep_coming(stub_server) -> None:
    url, _ = stub_server(token_delay=0.1)
    result = one(Target(url, timeout=0.3), RequestSpec(0, "a", 1, max_tokens=8))
    assert result.ok and result.output_tokens == 8 and result.e2e > 0.6


def test_several_models_are_taken_in_turn() -> None:
    target = Target("http://127.0.0.1:1", model="base,support,legal")
    specs = [RequestSpec(index=i, prompt="p", prompt_words=1, max_tokens=2) for i in range(4)]
    assert [target.payload(s)["model"] for s in specs] == ["base", "support", "legal", "base"]
    assert Target("http://127.0.0.1:1", model="m").payload(specs[1])["model"] == "m"
