"""The adapters a runner serves, by name, and which of them hold their weights in memory.

An adapter stays registered (name, directory, id) from its load to its unload; at most
`max_resident` of them (`--max-cpu-loras`, None: all) hold their weights at once. The others
are read again from disk when a request needs them, evicting the least recently used adapter
that no running request uses (`victims`). Pure bookkeeping: the weights live in the model's
projections (manager.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass


@dataclass
class Registered:
    name: str
    path: str
    digest: str  # of the files as last read (adapter.py): a reload compares it


class Registry:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}  # every registered adapter: name -> its id
        self.by_id: dict[int, Registered] = {}
        self._resident: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.max_resident: int | None = None
        self.loads_total = 0  # adapters read from disk (first loads and reloads)
        self.evictions_total = 0  # adapters whose weights were dropped to make room
        # The same two per adapter name, kept after an unload (counters never go back).
        self.loads: dict[str, int] = {}
        self.evictions: dict[str, int] = {}

    def add(self, adapter_id: int, entry: Registered) -> None:
        self.ids[entry.name] = adapter_id
        self.by_id[adapter_id] = entry

    def remove(self, name: str) -> int | None:
        """Forget `name`; its id (None if unknown)."""
        adapter_id = self.ids.pop(name, None)
        if adapter_id is not None:
            del self.by_id[adapter_id]
            self._resident.pop(adapter_id, None)
        return adapter_id

    def rekey(self, old: int, new: int) -> None:
        """The adapter's files changed: it goes on under a new id (its KV is never reused)."""
        entry = self.by_id.pop(old)
        self._resident.pop(old, None)
        self.add(new, entry)

    @property
    def resident(self) -> list[int]:
        """The ids whose weights are in memory, least recently used first."""
        return list(self._resident)

    def is_resident(self, adapter_id: int) -> bool:
        return adapter_id in self._resident

    def read(self, name: str) -> None:
        """`name`'s files were read from disk (a first load or a reload)."""
        self.loads_total += 1
        self.loads[name] = self.loads.get(name, 0) + 1

    def installed(self, adapter_id: int) -> None:
        self._resident[adapter_id] = None  # the most recently used

    def evicted(self, adapter_id: int) -> None:
        del self._resident[adapter_id]
        self.evictions_total += 1
        name = self.by_id[adapter_id].name
        self.evictions[name] = self.evictions.get(name, 0) + 1

    def adapters(self) -> tuple[tuple[str, int, int, int], ...]:
        """Each registered adapter as (name, 1 if its weights are in memory else 0, loads,
        evictions), by name: what the dashboard's LoRA panel shows (StepStats.lora_adapters)."""
        rows = (
            (e.name, int(i in self._resident), self.loads.get(e.name, 0),
             self.evictions.get(e.name, 0))
            for i, e in self.by_id.items()
        )  # fmt: skip
        return tuple(sorted(rows))

    def touch(self, ids: Iterable[int]) -> None:
        """These adapters were used by a step: the last to be evicted."""
        for adapter_id in ids:
            if adapter_id in self._resident:
                self._resident.move_to_end(adapter_id)

    def victims(self, keep: Collection[int], room_for: int) -> list[int] | None:
        """The resident adapters to evict, least recently used first, so that `room_for` more
        fit; never one in `keep` (a running request uses it). None: not enough room can be
        made now (the caller waits for an adapter to free up)."""
        if self.max_resident is None:
            return []
        surplus = len(self._resident) + room_for - self.max_resident
        if surplus <= 0:
            return []
        free = [i for i in self._resident if i not in keep]
        return free[:surplus] if len(free) >= surplus else None
