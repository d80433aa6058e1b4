"""One streaming request to an OpenAI-compatible server (`/v1/completions`) or Headrace's
`/v1/generate`, timed: TTFT, gaps between pieces of text, end-to-end; output tokens from the
server's `usage` when it reports it, else one per streamed piece.

The load goes through aiohttp (as vLLM's `bench serve`): a benchmark often shares its cores with
the server it measures, and aiohttp reads an SSE event for about a third of httpx's CPU
(`bench/http_overhead.py`: 50-95 against 130-190 us a token at 8-32 streams).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp

from headrace.bench.stats import RequestResult
from headrace.bench.workloads import RequestSpec


@dataclass
class Target:
    url: str
    api: str = "completions"  # or "generate"
    model: str | None = None
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    connection_per_request: bool = False
    timeout: float = 300.0

    @property
    def path(self) -> str:
        return "/v1/generate" if self.api == "generate" else "/v1/completions"

    def payload(self, spec: RequestSpec) -> dict[str, object]:
        body: dict[str, object] = {
            "prompt": spec.prompt,
            "max_tokens": spec.max_tokens,
            "temperature": self.temperature,
            "stream": True,
        }
        if self.top_p < 1.0:
            body["top_p"] = self.top_p
        if self.model is not None:  # a comma-separated list: request i takes name i mod n
            names = self.model.split(",")
            body["model"] = names[spec.index % len(names)]  # e.g. spread over LoRA adapters
        if self.api == "completions":
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    def headers(self, spec: RequestSpec) -> dict[str, str]:
        key = spec.tenant.api_key if spec.tenant and spec.tenant.api_key else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}


def make_client(target: Target) -> aiohttp.ClientSession:
    """No cap on connections (the load decides); a fresh one per request if asked."""
    return aiohttp.ClientSession(
        base_url=target.url,
        # `timeout` bounds each wait for bytes, not the request: a long stream stays legal
        timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=target.timeout),
        connector=aiohttp.TCPConnector(limit=0, force_close=target.connection_per_request),
        read_bufsize=1 << 20,  # a line (one SSE event) may be long: a whole text, logprobs
    )


@dataclass
class _Stream:
    """What the SSE events of one response told us."""

    first: float | None = None
    last: float | None = None
    pieces: int = 0
    itl: list[float] = field(default_factory=list)
    usage: dict[str, object] | None = None
    error: dict[str, object] | None = None
    text: list[str] = field(default_factory=list)

    def feed(self, event: dict[str, object], api: str, now: float) -> None:
        if isinstance(event.get("error"), dict):
            self.error = event["error"]  # type: ignore[assignment]
            return
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]  # type: ignore[assignment]
        if text := _text_of(event, api):
            self.text.append(text)
            if self.last is not None:
                self.itl.append(now - self.last)
            self.first = now if self.first is None else self.first
            self.last = now
            self.pieces += 1


def _text_of(event: dict[str, object], api: str) -> str:
    if api == "generate":
        return str(event.get("text") or "")
    choices = event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return str(choices[0].get("text") or "")
    return ""


async def send(
    client: aiohttp.ClientSession, target: Target, spec: RequestSpec, t0: float
) -> RequestResult:
    start = time.perf_counter()
    result = RequestResult(
        index=spec.index,
        start=start - t0,
        ok=False,
        tenant=spec.tenant.name if spec.tenant else None,
        tier=spec.tenant.tier if spec.tenant else None,
        kind=spec.kind,
        max_tokens=spec.max_tokens,
    )
    stream = _Stream()
    try:
        payload, headers = target.payload(spec), target.headers(spec)
        async with client.post(target.path, json=payload, headers=headers) as resp:
            result.status = resp.status
            if resp.status != 200:
                result.error, result.message = _http_error(resp.status, await resp.read())
                return result
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                stream.feed(json.loads(data), target.api, time.perf_counter() - start)
    except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors
        result.error, result.message = "timeout", str(exc) or type(exc).__name__
        return result
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        result.error, result.message = "bad_event", f"unparseable SSE event: {exc}"
        return result
    except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a line past read_bufsize
        result.error, result.message = _transport_error(exc), str(exc) or type(exc).__name__
        return result
    return _finish(result, stream, time.perf_counter() - start)


def _finish(result: RequestResult, stream: _Stream, e2e: float) -> RequestResult:
    result.e2e = e2e
    result.ttft = stream.first
    result.itl = stream.itl
    if stream.error is not None:
        result.error = str(stream.error.get("type") or "stream_error")
        result.message = str(stream.error.get("message") or "")
        return result
    usage = stream.usage or {}
    completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if isinstance(completion, int):
        result.output_tokens = completion
        result.tokens_from_usage = True
    else:
        result.output_tokens = stream.pieces
    if isinstance(prompt, int):
        result.prompt_tokens = prompt
    details = usage.get("prompt_tokens_details")
    cached = (
        details.get("cached_tokens") if isinstance(details, dict) else usage.get("cached_tokens")
    )
    if isinstance(cached, int):
        result.cached_tokens = cached
    result.text = "".join(stream.text)
    result.ok = True
    return result


def _http_error(status: int, body: bytes) -> tuple[str, str]:
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict):
        return str(err.get("type") or f"http_{status}"), str(err.get("message") or "")
    if isinstance(err, str):  # TGI and some others: {"error": "text", "error_type": ...}
        return f"http_{status}", err
    return f"http_{status}", body[:200].decode(errors="replace")


def _transport_error(exc: Exception) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return "protocol_error"
    return "read_error" if isinstance(exc, aiohttp.ClientOSError) else "transport_error"
