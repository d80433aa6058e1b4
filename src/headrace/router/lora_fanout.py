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

from headrace.engine.frontend.client import EngineClient
from headrace.router.lora_changes import LoraChanges
from headrace.router.router import Router

log = logging.getLogger(__name__)
Command = Callable[[str, str | None], Awaitable[None]]


async def lora_command(engine: EngineClient, name: str, path: str | None) -> None:
    """Load `path` as `name` (unload with `path` None) on each of `engine`'s replicas;
    ValueError with the reason when refused (nothing changed)."""
    replicas = [r.engine for r in engine.replicas] if isinstance(engine, Router) else [engine]
    changes = engine.lora_changes if isinstance(engine, Router) else LoraChanges()
    targets = [e for e in replicas if e.is_healthy]  # one restarting replays `changes` itself
    if not targets:
        raise ValueError("no replica of this model is running; try again once one is")
    commands: list[Command] = []
    for target in targets:
        command = getattr(target, "lora_command", None)
        if command is None:
            raise ValueError("adapters load at run time on local replicas only (use --lora)")
        commands.append(command)
    before = changes.copy()
    changes.record(name, path)  # first: a replica restarting meanwhile replays it too
    try:
        await (_unload(commands, name) if path is None else _load(commands, name, path))
    except ValueError:
        changes.restore(before)
        raise


async def _load(commands: list[Command], name: str, path: str) -> None:
    """On every replica, or (ValueError) on none."""
    done: list[Command] = []
    for command in commands:
        try:
            await command(name, path)
        except (ValueError, RuntimeError) as e:  # refused, or the replica died meanwhile
            for loaded in done:  # undo: every replica holds the same adapters
                with contextlib.suppress(ValueError, RuntimeError):
                    await loaded(name, None)
            raise ValueError(str(e)) from e
        done.append(command)


async def _unload(commands: list[Command], name: str) -> None:
    """From every replica that holds it; ValueError only when none did."""
    errors: list[Exception] = []
    for command in commands:
        try:
            await command(name, None)
        except (ValueError, RuntimeError) as e:
            errors.append(e)
    if len(errors) == len(commands):
        raise ValueError(str(errors[0]))
    if errors:
        log.warning("adapter %s was missing on %d replica(s)", name, len(errors))
