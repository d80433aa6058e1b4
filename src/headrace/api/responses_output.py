"""A response's output items, built as its text comes, and the typed stream events that tell
them (OpenAI's Responses events, each with its `sequence_number`):

    response.output_item.added  (a message, or a function_call with its call_id and name)
    response.content_part.added / response.output_text.delta ... / response.output_text.done /
    response.content_part.done                                  (a message's text)
    response.function_call_arguments.delta ... / .done          (a call's arguments)
    response.output_item.done

The text is read for calls by `ToolCallParser` when the request has tools. A call cut short by
the token limit is closed on the stream with status `incomplete` and left out of the output.
"""

from __future__ import annotations

import uuid
from typing import Any

from headrace.api.tool_parser import CallDelta, ToolCallParser

Event = dict[str, Any]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    def __init__(self, tools_active: bool, calls_first: bool = False) -> None:
        self.parser = ToolCallParser(calls_first) if tools_active else None
        self.items: list[dict[str, Any]] = []  # complete output items, in order
        self.text = ""  # the message's text
        self.calls: list[dict[str, Any]] = []  # chat-shaped calls, for the stored history
        self.seq = 0
        self._open: dict[str, Any] | None = None
        self._index = -1  # output_index of the open item

    def feed(self, text: str, finished: bool = False) -> list[Event]:
        """The events the new text makes (all of them, once `finished`)."""
        if self.parser is None:
            pieces: list[str | CallDelta] = [text] if text else []
        else:
            pieces = self.parser.feed(text) + (self.parser.finish() if finished else [])
        events: list[Event] = []
        for piece in pieces:
            events += self._text(piece) if isinstance(piece, str) else self._call(piece)
        if finished:
            events += self._close()
        return events

    def event(self, type: str, **fields: Any) -> Event:
        self.seq += 1
        return {"type": type, "sequence_number": self.seq - 1, **fields}

    def _text(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            self._open = {"type": "message", "id": item_id("msg"), "status": "in_progress",
                          "role": "assistant", "content": []}  # fmt: skip
            events += [self._added(), self._part("response.content_part.added", "")]
        self.text += text
        self._open["text"] = self._open.get("text", "") + text
        events.append(self._on_item("response.output_text.delta", content_index=0, delta=text,
                                    logprobs=[]))  # fmt: skip
        return events

    def _call(self, piece: CallDelta) -> list[Event]:
        if piece.id is None:
            assert self._open is not None
            self._open["arguments"] += piece.arguments
            return [self._on_item("response.function_call_arguments.delta", delta=piece.arguments)]
        events = self._close()
        self._open = {"type": "function_call", "id": item_id("fc"), "call_id": piece.id,
                      "name": piece.name, "arguments": "", "status": "in_progress"}  # fmt: skip
        return events + [self._added()]

    def _close(self) -> list[Event]:
        """Events that end the open item; a complete one joins `items`."""
        item, self._open = self._open, None
        if item is None:
            return []
        if item["type"] == "message":
            text = item.pop("text", "")
            done = {**item, "status": "completed", "content": [_text_part(text)]}
            self.items.append(done)
            return [
                self._on(item, "response.output_text.done", content_index=0, text=text,
                         logprobs=[]),
                self._part("response.content_part.done", text, item),
                self.event("response.output_item.done", output_index=self._index, item=done),
            ]  # fmt: skip
        complete = self.parser is not None and len(self.parser.calls) > len(self.calls)
        done = {**item, "status": "completed" if complete else "incomplete"}
        events = []
        if complete:
            self.items.append(done)
            function = {"name": item["name"], "arguments": item["arguments"]}
            self.calls.append({"id": item["call_id"], "type": "function", "function": function})
            events.append(self._on(item, "response.function_call_arguments.done",
                                   name=item["name"], arguments=item["arguments"]))  # fmt: skip
        return events + [
            self.event("response.output_item.done", output_index=self._index, item=done)
        ]

    def _added(self) -> Event:
        self._index += 1
        assert self._open is not None
        shown = {k: v for k, v in self._open.items() if k != "text"}
        return self.event("response.output_item.added", output_index=self._index, item=shown)

    def _part(self, type: str, text: str, item: dict[str, Any] | None = None) -> Event:
        return self._on(item or self._open, type, content_index=0, part=_text_part(text))

    def _on_item(self, type: str, **fields: Any) -> Event:
        return self._on(self._open, type, **fields)

    def _on(self, item: dict[str, Any] | None, type: str, **fields: Any) -> Event:
        assert item is not None
        return self.event(type, item_id=item["id"], output_index=self._index, **fields)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
