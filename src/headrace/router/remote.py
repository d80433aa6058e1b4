"""A replica that is another `headrace serve`, reached over HTTP: an `EngineClient`.

Requests stream from its `POST /v1/replica/generate` (token ids in, `GenerationChunk`s out);
its load comes from polling `GET /v1/stats` every `poll_interval_s`, and from the stats that
the first and last event of each stream carry. A poll or a stream that
fails at the transport level marks it unhealthy at once (the router then retries requests that
had not streamed anything); the next successful poll makes it healthy again.

A stream is never silent for long: the server sends an SSE comment every couple of seconds while
a request waits or between chunks. So a stream with nothing for `read_timeout_s` means a server
that froze (stopped, hung, its network gone): the stream ends with an error chunk and the
replica leaves the rotation, instead of holding its client forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams
from headrace.router.wire import (
    ReplicaAbortBody,
    chunk_from_json,
    encode_request,
    stats_from_json,
)

log = logging.getLogger("headrace.router")

POLL_INTERVAL_S = 0.25
POLL_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0  # RouterConfig.replica_read_timeout_s
CONNECT_TIMEOUT_S = 10.0
JSON = {"content-type": "application/json"}  # the bodies are msgspec's bytes


class RemoteEngine:
    def __init__(
        self,
        client: httpx.AsyncClient,
        model: str,
        max_model_len: int,
        tokenizer: Tokenizer,
        poll_interval_s: float = POLL_INTERVAL_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._client = client
        self._model = model
        self._max_model_len = max_model_len
        self._tokenizer = tokenizer
        self._poll_interval_s = poll_interval_s
        self._stream_timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=read_timeout_s)
        self._stats = StepStats()
        self._failure: str | None = None
        self._closed = False
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls,
        url: str,
        model: str | None = None,
        *,
        tokenizer: Tokenizer | None = None,
        api_key: str | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> RemoteEngine:
        """Reach the server at `url` and pick its `model` (or its only one); without a
        `tokenizer`, fetch the server's. Raises RuntimeError when that cannot be done."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers)
        try:
            models = (await _get_json(client, "/v1/stats"))["models"]
            if model is None:
                if len(models) != 1:
                    raise RuntimeError(f"{url} serves {sorted(models)}; say which one")
                model = next(iter(models))
            if model not in models:
                raise RuntimeError(f"{url} does not serve model {model!r}")
            await _check_replica_api(client, model)
            if tokenizer is None:
                tokenizer = await _fetch_tokenizer(client, model)
            engine = cls(client, model, int(models[model]["max_model_len"]), tokenizer,
                         poll_interval_s, read_timeout_s)  # fmt: skip
            engine._on_stats(models[model])
        except BaseException:
            await client.aclose()
            raise
        engine._poller = asyncio.create_task(engine._poll(), name=f"headrace-poll-{url}")
        return engine

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return str(self._client.base_url)

    @property
    def model_name(self) -> str:
        return self._model

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def failure(self) -> str | None:
        """Why it is not healthy (None when it is)."""
        return "closed" if self._closed else self._failure

    @property
    def is_healthy(self) -> bool:
        return not self._closed and self._failure is None

    @property
    def pid(self) -> int | None:
        return None  # on another server

    def describe(self) -> dict[str, object]:
        return {"url": self.url}

    def stats(self) -> StepStats:
        return self._stats

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        opts = options or GenerateOptions()
        body = encode_request(request_id, self._model, prompt_token_ids, params, opts)
        if not self.is_healthy:
            yield _error(request_id, f"remote replica {self.url} is down: {self._failure}")
            return
        try:
            async with self._client.stream(
                "POST", "/v1/replica/generate", content=body, headers=JSON,
                timeout=self._stream_timeout,
            ) as resp:  # fmt: skip
                if resp.status_code != 200:
                    yield await self._refused(request_id, resp)
                    return
                async for chunk in self._chunks(request_id, resp):
                    yield chunk
                    if chunk.finished:
                        return
            self._fail("its stream ended before the request finished")
            yield _error(request_id, f"remote replica {self.url} ended the stream early")
        except httpx.TimeoutException as e:  # a read timeout: nothing, not even a keep-alive
            self._fail(f"{type(e).__name__}: it stopped answering")
            yield _error(request_id, f"remote replica {self.url} stopped answering")
        except httpx.TransportError as e:
            self._fail(f"{type(e).__name__}: {e}")
            yield _error(request_id, f"remote replica {self.url} failed: {e}")

    async def abort(self, request_id: str) -> None:
        """Ask the server to end it; the stream then ends with an `abort` chunk."""
        with contextlib.suppress(httpx.HTTPError):
            body = msgspec.json.encode(ReplicaAbortBody(request_id, self._model))
            await self._client.post(
                "/v1/replica/abort", content=body, headers=JSON, timeout=POLL_TIMEOUT_S
            )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self._client.aclose()

    # -- helpers ----------------------------------------------------------------------------

    async def _chunks(
        self, request_id: str, resp: httpx.Response
    ) -> AsyncIterator[GenerationChunk]:
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):  # ": keep-alive" comments, blank separators
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                return
            try:
                chunk = self._event(request_id, msgspec.json.decode(data))
            except (ValueError, LookupError, TypeError, AttributeError, msgspec.MsgspecError) as e:
                # The server's fault, not the request's (a ValueError would answer 400).
                self._fail(f"a malformed event: {type(e).__name__}: {e}")
                chunk = _error(request_id, f"remote replica {self.url} sent a malformed event")
            yield chunk

    def _event(self, request_id: str, event: dict[str, Any]) -> GenerationChunk:
        if "request_id" not in event:  # an error event: the server is shutting down
            message = str(event["error"].get("message", "remote error"))
            self._fail(message)
            return _error(request_id, f"remote replica {self.url}: {message}")
        if "stats" in event:  # fresher than the last poll
            self._stats = stats_from_json(event["stats"])
        return chunk_from_json(event)

    async def _refused(self, request_id: str, resp: httpx.Response) -> GenerationChunk:
        """A status other than 200: a 400 is the request's fault, anything else the server's."""
        await resp.aread()
        try:
            message = str(resp.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = resp.text[:200]
        if resp.status_code == 400:
            raise ValueError(message)
        self._fail(f"HTTP {resp.status_code}: {message}")
        return _error(request_id, f"remote replica {self.url} refused: {message}")

    def _fail(self, reason: str) -> None:
        if self._failure is None and not self._closed:
            log.error("remote replica %s failed: %s", self.url, reason)
        self._failure = reason

    def _on_stats(self, model: dict[str, Any]) -> None:
        self._stats = stats_from_json(model["stats"])
        if model.get("healthy", True):
            self._failure = None
        else:
            self._fail("it has no healthy replica of the model")

    async def _poll(self) -> None:
        while True:
            try:
                models = (await _get_json(self._client, "/v1/stats"))["models"]
                if self._model not in models:
                    self._fail(f"it no longer serves {self._model!r}")
                else:
                    self._on_stats(models[self._model])
            except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as e:
                self._fail(f"stats poll: {type(e).__name__}: {e}")
            await asyncio.sleep(self._poll_interval_s)


async def _get_json(client: httpx.AsyncClient, path: str, **params: str) -> dict[str, Any]:
    try:
        resp = await client.get(path, params=params, timeout=POLL_TIMEOUT_S)
    except httpx.HTTPError as e:
        raise RuntimeError(f"{client.base_url}{path}: {type(e).__name__}: {e}") from e
    if resp.status_code != 200:
        raise RuntimeError(f"{client.base_url}{path}: HTTP {resp.status_code}: {resp.text[:200]}")
    data: dict[str, Any] = resp.json()
    return data


async def _check_replica_api(client: httpx.AsyncClient, model: str) -> None:
    """Refuse at start a server whose replica API is off or needs another key (its stats may
    be open while it is): otherwise it would fail every request routed to it, then rejoin."""
    probe = msgspec.json.encode(ReplicaAbortBody("headrace-probe", model))  # aborts nothing
    try:
        resp = await client.post(
            "/v1/replica/abort", content=probe, headers=JSON, timeout=POLL_TIMEOUT_S
        )
    except httpx.HTTPError as e:
        raise RuntimeError(f"{client.base_url}: {type(e).__name__}: {e}") from e
    if resp.status_code != 200:
        raise RuntimeError(
            f"{client.base_url} does not let this server use its replica API (HTTP "
            f"{resp.status_code}: {resp.text[:200]}): start it with --admin-key KEY and give "
            "this one --replica-api-key KEY (or start it with --replica-api)"
        )


async def _fetch_tokenizer(client: httpx.AsyncClient, model: str) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    from headrace.loader.tokenizer import Tokenizer as ModelTokenizer

    data = await _get_json(client, "/v1/replica/tokenizer", model=model)
    tok = HFTokenizer.from_str(data["tokenizer"])
    return ModelTokenizer(tok, data.get("config"), data.get("architecture"))


def _error(request_id: str, message: str) -> GenerationChunk:
    return GenerationChunk(request_id, "", [], FinishReason.ERROR, error=message)
