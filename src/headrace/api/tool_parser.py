"""Reading `tool_format`'s calls back out of the model's text as it streams.

The grammar guarantees the format, so this is a small state machine, not a guesser: text until
the call marker (held back while the text's end could still be the marker's beginning), then
the head up to the arguments (the call is announced: index, id, name), then the arguments'
JSON, passed on as it comes and ended by its closing brace (a scanner that knows strings and
escapes), then the call's tail. A call is complete only when its tail is read: a call cut short
(by `max_tokens`) is never in `calls`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from headrace.api.tool_format import CALL_OPEN, HEAD_PREFIX, HEAD_SUFFIX, SEPARATOR, TAIL


@dataclass
class CallDelta:
    """A piece of call `index`: its start (`id` and `name` set) or a fragment of arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass
class Call:
    id: str
    name: str
    arguments: str  # JSON text


Delta = str | CallDelta  # a str is content text


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _JsonEnd:
    """Finds where one JSON value (an object) ends, fed a character at a time."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def feed(self, c: str) -> bool:
        """True when `c` closed the value."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


@dataclass
class ToolCallParser:
    """`calls_first`: calls may only open the answer (an answer under a JSON response format is
    that JSON from its first character, and may hold the marker inside a string)."""

    calls_first: bool = False
    calls: list[Call] = field(default_factory=list)  # complete calls, in order
    _state: str = "text"  # text, head, args, tail or between
    _buf: str = ""
    _current: Call | None = None
    _scan: _JsonEnd = field(default_factory=_JsonEnd)
    text: str = ""  # all content text so far

    @property
    def in_call(self) -> bool:
        """A call was started (its marker written) and is not complete."""
        return self._state in ("head", "args", "tail")

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        out: list[Delta] = []
        while self._buf and self._step(out):
            pass
        return out

    def finish(self) -> list[Delta]:
        """The text held back at the end (a call cut short is dropped)."""
        out: list[Delta] = []
        if self._state == "text" and self._buf:
            self._text(out, self._buf)
        self._buf = ""
        return out

    def _step(self, out: list[Delta]) -> bool:
        """Consume what the buffer allows in the current state; False: wait for more."""
        return {
            "text": self._in_text, "head": self._in_head, "args": self._in_args,
            "tail": self._in_tail, "between": self._between,
        }[self._state](out)  # fmt: skip

    def _in_text(self, out: list[Delta]) -> bool:
        if self.calls_first and (self.text or self.calls or not CALL_OPEN.startswith(
            self._buf[: len(CALL_OPEN)]
        )):  # fmt: skip
            self._text(out, self._buf)  # the answer is text: no call can follow
            self._buf = ""
            return False
        at = self._buf.find(CALL_OPEN)
        if at >= 0:
            self._text(out, self._buf[:at])
            self._buf = self._buf[at + len(CALL_OPEN) :]
            self._state = "head"
            return True
        keep = _partial_suffix(self._buf, CALL_OPEN)
        self._text(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _in_head(self, out: list[Delta]) -> bool:
        end = self._buf.find(HEAD_SUFFIX, len(HEAD_PREFIX))
        if not self._buf.startswith(HEAD_PREFIX) or end < 0:
            return False
        name = self._buf[len(HEAD_PREFIX) : end]
        self._buf = self._buf[end + len(HEAD_SUFFIX) :]
        self._current = Call(new_call_id(), name, "")
        self._scan = _JsonEnd()
        out.append(CallDelta(len(self.calls), id=self._current.id, name=name))
        self._state = "args"
        return True

    def _in_args(self, out: list[Delta]) -> bool:
        assert self._current is not None
        done = next((i + 1 for i, c in enumerate(self._buf) if self._scan.feed(c)), None)
        piece = self._buf[:done]
        self._buf = self._buf[len(piece) :]
        self._current.arguments += piece
        if piece:
            out.append(CallDelta(len(self.calls), arguments=piece))
        if done is None:
            return False
        self._state = "tail"
        return True

    def _in_tail(self, out: list[Delta]) -> bool:
        if not self._buf.startswith(TAIL):
            return False
        assert self._current is not None
        self._buf = self._buf[len(TAIL) :]
        self.calls.append(self._current)
        self._current = None
        self._state = "between"
        return True

    def _between(self, out: list[Delta]) -> bool:
        nxt = SEPARATOR + CALL_OPEN
        if self._buf.startswith(nxt):
            self._buf = self._buf[len(nxt) :]
            self._state = "head"
            return True
        if nxt.startswith(self._buf):
            return False
        self._state = "text"  # not under a tools grammar: whatever follows is text
        return True

    def _text(self, out: list[Delta], text: str) -> None:
        if text:
            self.text += text
            out.append(text)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def parse_calls(text: str, calls_first: bool = False) -> ToolCallParser:
    """A whole answer's text and calls (non-streaming)."""
    parser = ToolCallParser(calls_first)
    parser.feed(text)
    parser.finish()
    return parser
