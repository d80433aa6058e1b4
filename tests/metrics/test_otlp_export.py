"""`--otlp-traces-endpoint` end to end: a real `headrace serve` exports its request spans over
OTLP/HTTP to a receiver on 127.0.0.1 that decodes them as a collector would; the request span
names its replica and continues the caller's trace."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, make_tiny_llama, start_server, tiny_server_args
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Receiver:
    """An OTLP/HTTP trace endpoint that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server API)
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("otlp") / "tiny")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def serve(model: Path, log_dir: Path, *extra: str) -> Server:
    server = start_server(
        tiny_server_args(model) + list(extra), log_dir, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}
    )
    server.wait_ready()
    return server


def generate(server: Server, headers: dict[str, str] | None = None) -> None:
    body = {"prompt": "Hello there", "max_tokens": 5, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/generate", json=body, headers=headers or {}, timeout=60)
    assert r.status_code == 200, r.text


def test_spans_reach_a_collector(model: Path, receiver: Receiver, tmp_path: Path) -> None:
    server = serve(model, tmp_path, "--otlp-traces-endpoint", receiver.url)
    try:
        generate(server, {"traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"})
        deadline = time.monotonic() + 20
        while len(receiver.spans) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        assert server.stop() in (0, -15), server.log()
    names = sorted(s.name for s in receiver.spans)
    assert names == ["decode", "llm_request", "prefill", "queue"], names
    root = next(s for s in receiver.spans if s.name == "llm_request")
    assert root.trace_id.hex() == CALLER_TRACE
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["headrace.replica"].string_value == "tiny/0"
    assert attrs["headrace.tenant"].string_value == "default"
    assert attrs["gen_ai.usage.output_tokens"].int_value == 5
    assert [v.string_value for v in attrs["gen_ai.response.finish_reasons"].array_value.values] == [
        "length"
    ]
    children = [s for s in receiver.spans if s.name != "llm_request"]
    assert {s.parent_span_id for s in children} == {root.span_id}
