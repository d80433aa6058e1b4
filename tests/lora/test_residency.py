"""`--max-cpu-loras` without a model: the least-recently-used bookkeeping, a request that waits
(never fails) while no adapter can be evicted, and the flag's checks at start."""

from __future__ import annotations

import argparse
import logging

import pytest
from factories import make_request, make_scheduler

from headrace.cli import main
from headrace.commands.serve import add_arguments
from headrace.config import HeadraceConfig, SchedulerConfig
from headrace.engine.outputs import RunnerOutput
from headrace.lora.registry import Registered, Registry
from headrace.request import Request


def _registry(cap: int, ids: tuple[int, ...]) -> Registry:
    reg = Registry()
    reg.max_resident = cap
    for i in ids:
        reg.add(i, Registered(f"n{i}", f"/a/{i}", "digest"))
        reg.installed(i)
    return reg


def test_the_least_recently_used_adapter_no_request_runs_is_evicted() -> None:
    reg = _registry(3, (1, 2, 3))
    assert reg.victims(keep=(), room_for=0) == []
    assert reg.victims(keep=(), room_for=1) == [1]
    reg.touch([1])  # a step used 1: 2 is now the least recently used
    assert reg.resident == [2, 3, 1] and reg.victims(keep=(), room_for=1) == [2]
    assert reg.victims(keep={2}, room_for=1) == [3]
    assert reg.victims(keep={1, 2, 3}, room_for=1) is None  # all in use: wait
    reg.evicted(2)
    assert reg.resident == [3, 1] and reg.evictions_total == 1 and "n2" in reg.ids
    assert Registry().victims(keep=(), room_for=5) == []  # no cap: every adapter stays


def test_an_adapter_request_waits_while_its_weights_cannot_be_loaded() -> None:
    sched = make_scheduler(max_loras=2, num_speculative_tokens=0)
    room = [False]
    sched.run.lora_ready = lambda req: room[0]
    lora = make_request("lora", max_tokens=2, ignore_eos=True)
    lora.lora_id = 3
    reqs: list[Request] = [lora, make_request("base", max_tokens=2, ignore_eos=True)]
    for req in reqs:
        sched.add_request(req)
    order: list[str] = []
    for step in range(8):
        room[0] = step >= 3  # an adapter frees up after three steps
        out = sched.schedule()
        order += [s.request_id for s in out.scheduled if s.request_id not in order]
        sampled = {s.request_id: 7 for s in out.scheduled if s.sample}
        assert all(o.error is None for o in sched.update(out, RunnerOutput(sampled=sampled)))
        sched.blocks.check_invariants()
    assert order == ["base", "lora"] and not sched.has_work()


def test_fewer_cpu_loras_than_loras_is_refused_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="--max-cpu-loras 1 is below --max-loras 2"):
        SchedulerConfig(max_loras=2, max_cpu_loras=1)
    assert SchedulerConfig().max_cpu_loras is None  # default: every adapter stays in memory
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-loras", "2", "--max-cpu-loras", "3"])
    assert HeadraceConfig.from_args(args).scheduler.max_cpu_loras == 3
    with caplog.at_level(logging.ERROR):
        assert main(["serve", "--max-cpu-loras", "1", "--max-loras", "2"]) == 2
    assert "--max-cpu-loras 1 is below --max-loras 2" in caplog.text
