"""Stop strings cut exactly from a text stream, never leaking a partial match.

Text that could be the start of a stop string is held back until the next piece decides it;
the final text is always the concatenation of the streamed pieces.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of `held + text` that is safe to stream; sets `stopped` on a match."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        hit = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            self._held = ""
            return buf[:hit]
        keep = max(_partial_suffix(buf, s) for s in self.stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The request ended for another reason: the held text was no stop string after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _partial_suffix(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
