"""What a model's replicas replay after a restart: adapters loaded at run time, and --lora
ones unloaded; a replay refused by the new engine is logged, the rest still applied."""

from __future__ import annotations

import asyncio

from headrace.router.lora_changes import LoraChanges


class Engine:
    def __init__(self) -> None:
        self.commands: list[tuple[str, str | None]] = []

    async def lora_command(self, name: str, path: str | None) -> None:
        self.commands.append((name, path))
        if path == "/gone":
            raise ValueError("cannot read the adapter config")


def test_changes_replay_in_order() -> None:
    changes = LoraChanges()
    changes.record("new", "/a/new")
    changes.record("startup", None)  # given with --lora, unloaded at run time
    changes.record("brief", "/a/brief")
    changes.record("brief", None)  # loaded then unloaded: nothing to replay
    changes.record("moved", "/gone")
    assert changes.loaded == {"new": "/a/new", "moved": "/gone"}
    assert changes.unloaded == {"startup"}
    engine = Engine()
    asyncio.run(changes.replay(engine))  # type: ignore[arg-type]
    assert engine.commands == [("startup", None), ("new", "/a/new"), ("moved", "/gone")]
    changes.record("startup", "/a/startup")  # loaded again: no longer an unload to replay
    assert changes.unloaded == set() and changes.loaded["startup"] == "/a/startup"
