"""What changed in a model's LoRA adapters since its replicas started with --lora: a local
replica started later (a restart after a crash, the autoscaler's) replays it before it serves,
so every replica of a model holds the same adapters."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from headrace.engine.frontend.client import EngineClient

log = logging.getLogger(__name__)


@dataclass
class LoraChanges:
    """A model's adapters changed at run time: loaded (name -> path), and --lora ones unloaded."""

    loaded: dict[str, str] = field(default_factory=dict)
    unloaded: set[str] = field(default_factory=set)

    def copy(self) -> LoraChanges:
        return LoraChanges(dict(self.loaded), set(self.unloaded))

    def restore(self, earlier: LoraChanges) -> None:
        self.loaded, self.unloaded = earlier.loaded, earlier.unloaded

    def record(self, name: str, path: str | None) -> None:
        if path is not None:
            self.loaded[name] = path
            self.unloaded.discard(name)
        elif self.loaded.pop(name, None) is None:
            self.unloaded.add(name)

    async def replay(self, engine: EngineClient) -> None:
        """Bring a freshly started engine to the same adapters (a failure is logged: that
        adapter's requests then fail on this replica, the replica still serves the rest)."""
        command = getattr(engine, "lora_command", None)
        if command is None:
            return
        changes = [(n, None) for n in self.unloaded] + list(self.loaded.items())
        for name, path in changes:
            try:
                await command(name, path)
            except ValueError as e:
                log.warning("a restarted replica did not take adapter %s again: %s", name, e)
