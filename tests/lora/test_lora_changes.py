"""Run-time adapters over a model's replicas: a load refused by one is undone on the others;
a restarting replica is skipped and replays the changes (adapters loaded at run time, --lora
ones unloaded) when it is back; a replay refused by the new engine is logged, the rest applied."""

from __future__ import annotations

import asyncio

import pytest
from fake_engine import FakeEngine

from headrace.router.lora_changes import LoraChanges
from headrace.router.lora_fanout import lora_command
from headrace.router.replica import Replica as ReplicaOf
from headrace.router.router import Router


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


class Replica(FakeEngine):
    def __init__(self, refuse: bool = False) -> None:
        self.loaded: set[str] = set()
        self.refuse = refuse

    async def lora_command(self, name: str, path: str | None) -> None:
        if path is None:
            self.loaded.discard(name)
        elif self.refuse:
            raise ValueError("rank 128 is above --max-lora-rank 64")
        else:
            self.loaded.add(name)


def test_a_load_refused_by_one_replica_is_undone_on_the_others() -> None:
    good, bad = Replica(), Replica(refuse=True)
    router = Router("m", [ReplicaOf(f"m/{i}", e) for i, e in enumerate((good, bad))])
    with pytest.raises(ValueError, match="max-lora-rank"):
        asyncio.run(lora_command(router, "a", "/a"))
    assert good.loaded == set() and router.lora_changes.loaded == {}  # as before
    bad.refuse = False
    asyncio.run(lora_command(router, "a", "/a"))
    assert good.loaded == bad.loaded == {"a"} and router.lora_changes.loaded == {"a": "/a"}
    good.healthy = False  # restarting: skipped now, it replays the changes when it is back
    asyncio.run(lora_command(router, "a", None))
    assert bad.loaded == set() and good.loaded == {"a"} and router.lora_changes.loaded == {}
