"""The requests open in one front end, each with its text stream and its queue of chunks.

The caller names a request; the core sees a unique id of its own (`<request id>#<n>`), so a
caller may reuse an id once its request ended. Outputs from the core are routed by that id;
one for a request that already ended here (a stop string, the caller gone) is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from headrace.engine.frontend.client import GenerationChunk
from headrace.engine.frontend.text_stream import RequestTextStream
from headrace.engine.messages import RequestOutput


@dataclass
class Stream:
    core_id: str
    text: RequestTextStream
    chunks: asyncio.Queue[GenerationChunk] = field(default_factory=asyncio.Queue)


class OpenStreams:
    def __init__(self) -> None:
        self._streams: dict[str, Stream] = {}  # by the caller's request id
        self._by_core_id: dict[str, str] = {}  # core id -> caller's request id
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._streams)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def get(self, request_id: str) -> Stream | None:
        return self._streams.get(request_id)

    def new(self, text: RequestTextStream) -> Stream:
        """A stream for `text`'s request with a core id of its own (not yet open)."""
        return Stream(f"{text.request_id}#{next(self._ids)}", text)

    def open(self, stream: Stream) -> None:
        self._streams[stream.text.request_id] = stream
        self._by_core_id[stream.core_id] = stream.text.request_id

    def route(self, out: RequestOutput) -> str | None:
        """Queue a core output's chunk for its request; returns the core id to abort when the
        text ended it here (a stop string) while the core does not know yet."""
        request_id = self._by_core_id.get(out.request_id)
        stream = self._streams.get(request_id) if request_id is not None else None
        if stream is None:
            return None
        chunk = stream.text.process(out)
        if chunk is None:
            return None
        stream.chunks.put_nowait(chunk)
        if not chunk.finished:
            return None
        self.forget(stream)
        return None if out.finished else stream.core_id

    def end_all(self, reason: str) -> None:
        """Every open request ends with an error chunk saying `reason`."""
        for stream in list(self._streams.values()):
            if not stream.text.finished:
                stream.chunks.put_nowait(stream.text.fail(reason))
            self.forget(stream)

    def forget(self, stream: Stream) -> None:
        if self._streams.get(stream.text.request_id) is stream:
            del self._streams[stream.text.request_id]
        self._by_core_id.pop(stream.core_id, None)
