"""The front end's cache of compiled grammars, keyed by (kind, source): a client that sends the
same schema again pays nothing. Bounded by entries and by bytes, since a source may be as large
as a request body (1 MB): sources over `max_source_bytes` are compiled every time, not kept,
and a failure is kept like a success, its message counted in the bound.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable

Compiled = tuple[str, str]  # (grammar, error message or "")
Compile = Callable[[str, str], Compiled]

MAX_ENTRIES = 512
MAX_BYTES = 32 << 20
MAX_SOURCE_BYTES = 64 << 10


class GrammarCache:
    def __init__(
        self,
        compile_: Compile,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        max_source_bytes: int = MAX_SOURCE_BYTES,
    ) -> None:
        self._compile = compile_
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_source_bytes = max_source_bytes
        self._entries: OrderedDict[tuple[str, str], tuple[Compiled, int]] = OrderedDict()
        self._lock = threading.Lock()  # callers are worker threads (asyncio.to_thread)
        self.nbytes = 0  # memory held by the cached keys and values

    def get(self, kind: str, source: str) -> Compiled:
        """`compile_(kind, source)`, from the cache where it was kept."""
        key = (kind, source)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit[0]
        compiled = self._compile(kind, source)  # outside the lock: it may take milliseconds
        size = _size(kind, source, *compiled)
        if sys.getsizeof(source) <= self.max_source_bytes and size <= self.max_bytes:
            self._keep(key, compiled, size)
        return compiled

    def __len__(self) -> int:
        return len(self._entries)

    def _keep(self, key: tuple[str, str], compiled: Compiled, size: int) -> None:
        with self._lock:
            old = self._entries.pop(key, None)  # another thread compiled it meanwhile
            if old is not None:
                self.nbytes -= old[1]
            self._entries[key] = (compiled, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.nbytes -= dropped


def _size(*texts: str) -> int:
    return sum(sys.getsizeof(t) for t in texts)
