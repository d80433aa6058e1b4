"""A LoRA adapter loaded or unloaded at run time on every replica of a model.

Only local replicas (engine cores this server started) take adapters at run time; a remote or
Ray replica refuses, and so does the whole command. A load refused by one replica is undone on
those that took it, so the replicas never disagree on what a model's adapters are. The router's
`LoraChanges` remembers what changed since the start (--lora): a local replica started later
(a restart, the autoscaler) replays it before it joins.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from headrace.engine.client import EngineClient
from headrace.router.lora_changes import LoraChanges
from headrace.router.router import Router

log = logging.getLogger(__name__)
Command = Callable[[str, str | None], Awaitable[None]]


async def lora_command(engine: EngineClient, name: str, path: str | None) -> None:
    """Load `path` as `name` (unload with `path` None) on each of `engine`'s replicas;
    ValueError with the reason when refused (nothing changed)."""
    targets = [r.engine for r in engine.replicas] if isinstance(engine, Router) else [engine]
    changes = engine.lora_changes if isinstance(engine, Router) else LoraChanges()
    commands: list[Command] = []
    for target in targets:
        command = getattr(target, "lora_command", None)
        if command is None:
            raise ValueError("adapters load at run time on local replicas only (use --lora)")
        commands.append(command)
    if path is None:
        await _unload(commands, name)
        changes.record(name, None)
        return
    done: list[Command] = []
    for command in commands:
        try:
            await command(name, path)
        except ValueError:
            for loaded in done:  # undo: every replica holds the same adapters
                with contextlib.suppress(ValueError, RuntimeError):
                    await loaded(name, None)
            raise
        done.append(command)
    changes.record(name, path)


async def _unload(commands: list[Command], name: str) -> None:
    """From every replica that holds it; ValueError only when none did."""
    errors: list[ValueError] = []
    for command in commands:
        try:
            await command(name, None)
        except ValueError as e:
            errors.append(e)
    if len(errors) == len(commands):
        raise errors[0]
    if errors:
        log.warning("adapter %s was missing on %d replica(s)", name, len(errors))
