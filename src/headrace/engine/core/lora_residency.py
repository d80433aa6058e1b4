"""`--max-cpu-loras`: a request's adapter is made resident before the request is admitted.

The scheduler asks `ready(req)` of each adapter request it would admit, before the prefix
cache is consulted. An adapter whose weights were evicted is read again from disk then,
evicting the least recently used adapter that no running request uses. Admitted requests
run, so their adapters are kept; since a step holds at most `max_loras` adapters and
`max_cpu_loras >= max_loras`, there is always one to evict for a request that fits the step,
and a request is never failed for it (if none can be, it waits like one past `max_loras`).

Files changed on disk since the last read: the adapter goes on under a new id, and the
waiting requests of the old one (which hold no KV: only running adapters are kept) take the
new id and its prefix-cache salt, so KV is never shared across different weights. Files that
cannot be read or checked any more: the adapter's requests end with an error after the
schedule (`fail_unreadable`); the adapter stays registered, and a later request tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Protocol

from headrace.config import SchedulerConfig
from headrace.engine.sched.scheduler import Scheduler
from headrace.lora.names import LoraError
from headrace.request import Request, lora_salt_suffix

log = logging.getLogger(__name__)


class Adapters(Protocol):
    """What this needs of `headrace.lora.manager.LoraManager` (torch-free here)."""

    @property
    def ids(self) -> dict[str, int]: ...

    def ensure_resident(self, adapter_id: int, keep: Collection[int]) -> int | None: ...


class LoraResidency:
    def __init__(self, adapters: Adapters, scheduler: Scheduler) -> None:
        self.adapters = adapters
        self.scheduler = scheduler
        self.unreadable: dict[int, str] = {}  # adapter id -> why, until its requests end

    def ready(self, req: Request) -> bool:
        """Whether `req`'s adapter is in memory now (read again if need be); False: wait."""
        if req.lora_id in self.unreadable:
            return False
        keep = {r.lora_id for r in self.scheduler.running if r.lora_id}
        try:
            adapter_id = self.adapters.ensure_resident(req.lora_id, keep)
        except LoraError as e:
            self.unreadable[req.lora_id] = str(e)
            return False
        if adapter_id is None:
            return False
        if adapter_id != req.lora_id:
            self._rebind(req.lora_id, adapter_id)
        return True

    def fail_unreadable(self) -> None:
        """End the requests of adapters whose files could not be read again (after a
        schedule: none of them runs, and none holds KV)."""
        for adapter_id, why in self.unreadable.items():
            users = [r.request_id for r in self.scheduler.requests.values()
                     if r.lora_id == adapter_id]  # fmt: skip
            name = self._name(adapter_id)
            log.error("LoRA adapter %s cannot be read again: %s", name, why)
            self.scheduler.fail(users, f"adapter {name!r} cannot be served: {why}")
        self.unreadable.clear()

    def _rebind(self, old: int, new: int) -> None:
        """The waiting requests of adapter id `old` go on with `new` and its cache salt."""
        old_suffix, new_suffix = lora_salt_suffix(old), lora_salt_suffix(new)
        for r in self.scheduler.requests.values():
            if r.lora_id == old:
                r.lora_id = new
                r.cache_salt = r.cache_salt.removesuffix(old_suffix) + new_suffix

    def _name(self, adapter_id: int) -> str:
        names = [n for n, i in self.adapters.ids.items() if i == adapter_id]
        return names[0] if names else f"#{adapter_id}"


def lora_residency(
    config: SchedulerConfig, runner: object, scheduler: Scheduler
) -> LoraResidency | None:
    """With --max-cpu-loras, the scheduler admits an adapter request once its weights are in
    memory; without it every adapter always is."""
    loras = getattr(runner, "loras", None)  # test runners hold no adapters
    if loras is None or config.max_cpu_loras is None:
        return None
    loras.set_max_resident(config.max_cpu_loras)  # a runner built elsewhere: trim it now
    residency = LoraResidency(loras, scheduler)
    scheduler.run.lora_ready = residency.ready
    return residency
