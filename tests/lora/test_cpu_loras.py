"""`--max-cpu-loras`: four adapters through two places in memory, on a real engine core.

Each request's tokens equal those of a core holding all four (fp32, greedy); at no step are
more than two adapters' weights installed; a reload of the same files keeps the adapter's id
(and its cached KV), of changed files gives a new one (no KV shared across weights); files
gone end that adapter's requests with an error, and nothing leaks.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from factories import hf_greedy, make_tiny, prompts
from factories.lora import make_adapter

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.messages import EngineCoreRequest, LoraCommand, RequestOutput
from headrace.layers.linear import MergedLinear
from headrace.request import FinishReason, SamplingParams

NAMES = ("a", "b", "c", "d")
NEW = 6
Ask = tuple[str, str | None, list[int]]  # request id, adapter (None: the base), prompt


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cpu-loras")
    make_tiny("llama", tmp / "tiny")
    for seed, name in enumerate(NAMES, start=1):
        make_adapter(tmp / "tiny", tmp / name, seed, r=4)
    return tmp


def _core(made: Path, adapters: Path, cap: int | None) -> EngineCore:
    """A core serving NAMES from `adapters` (copies a test may change), two per step."""
    lora = tuple(f"{n}={adapters / n}" for n in NAMES)
    model = ModelConfig(model=str(made / "tiny"), dtype="float32", lora=lora)
    sched = SchedulerConfig(max_loras=2, max_cpu_loras=cap)
    return EngineCore.from_configs(model, CacheConfig(block_size=4, num_kv_blocks=128), sched)


def _copies(made: Path, into: Path) -> Path:
    for name in NAMES:
        shutil.copytree(made / name, into / name)
    return into


def _run(core: EngineCore, asks: Iterable[Ask]) -> dict[str, RequestOutput | list[int]]:
    """Run the requests to the end; each one's tokens, or its last output if it failed.
    Checks after every step that at most `max_cpu_loras` adapters hold weights."""
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    for rid, lora, prompt in asks:
        core.add_request(EngineCoreRequest(rid, prompt, params, tenant="t", lora_name=lora))
    got: dict[str, Any] = {}
    while core.has_work():
        outputs, stats = core.step()
        for o in outputs:
            got[o.request_id] = got.get(o.request_id, []) + o.new_token_ids
            if o.finish_reason is FinishReason.ERROR:
                got[o.request_id] = o
        _check_resident(core)
    core.block_manager.check_invariants()
    assert stats.num_running == stats.num_waiting == stats.kv_blocks_used == 0  # no leak
    return got


def _check_resident(core: EngineCore) -> None:
    cap = core.scheduler.config.max_cpu_loras
    if cap is None:
        return
    installed: set[int] = set()
    for module in core.runner.model.modules():  # type: ignore[attr-defined]
        if isinstance(module, MergedLinear) and module.lora is not None:
            installed |= set(module.lora.weights)
    assert len(installed) <= cap


def _asks(tag: str, names: Iterable[str | None], n_prompts: int = 2) -> list[Ask]:
    ps = prompts(n_prompts)
    return [(f"{tag}-{m}-{i}", m, ps[i]) for m in names for i in range(n_prompts)]


def _registry(core: EngineCore) -> Any:
    return core.runner.loras.registry  # type: ignore[attr-defined]


def test_four_adapters_in_two_places_say_what_all_four_resident_say(made: Path) -> None:
    full, capped = _core(made, made, None), _core(made, made, 2)
    assert len(_registry(capped).resident) == 2 and len(_registry(capped).ids) == 4
    ids = dict(capped.runner.loras.ids)  # type: ignore[attr-defined]
    together = _asks("t", (*NAMES, None))  # all at once: adapters wait their turn
    assert _run(capped, together) == _run(full, together)
    for ask in [a for name in (*NAMES, "a", "c") for a in _asks("s", [name])]:
        assert _run(capped, [ask]) == _run(full, [ask])  # one after another: reads again
    reg = _registry(capped)
    assert reg.loads_total >= 4 + 6 and reg.evictions_total >= 2 + 6
    assert capped.runner.loras.ids == ids  # type: ignore[attr-defined]  # same files: same ids
    stats = capped.stats()
    assert (stats.lora_loads_total, stats.lora_evictions_total) == (
        reg.loads_total, reg.evictions_total,
    )  # fmt: skip


def test_loaded_at_run_time_beyond_the_cap(made: Path, tmp_path: Path) -> None:
    """A fifth adapter loaded at run time joins the rotation; /v1/models' names stay all."""
    core = _core(made, made, 2)
    make_adapter(made / "tiny", tmp_path / "e", seed=11, r=4)
    assert core.apply_lora(LoraCommand("c1", "e", str(tmp_path / "e"))).error is None
    assert sorted(core.runner.loras.ids) == ["a", "b", "c", "d", "e"]  # type: ignore[attr-defined]
    asks = [a for i, m in enumerate(("e", "a", "b", "e")) for a in _asks(f"r{i}", [m], 1)]
    full = _core(made, made, None)
    assert full.apply_lora(LoraCommand("c1", "e", str(tmp_path / "e"))).error is None
    assert _run(core, asks) == _run(full, asks)


def test_reload_keeps_the_id_of_the_same_files_and_not_of_changed_ones(
    made: Path, tmp_path: Path
) -> None:
    core = _core(made, _copies(made, tmp_path), 2)
    prompt = prompts(2)[1] * 2  # several blocks: a second request can hit the cache
    loras = core.runner.loras  # type: ignore[attr-defined]

    def ask(rid: str, name: str) -> tuple[list[int], RequestOutput]:
        """Run `name` on the prompt after c and d pushed it out of memory."""
        _run(core, _asks(rid, ("c", "d"), n_prompts=1))
        assert not loras.registry.is_resident(loras.ids[name])
        return _last(core, rid, name, prompt)

    first_id = loras.ids["a"]
    assert ask("1", "a")[1].num_cached_tokens == 0
    _, again = ask("2", "a")
    assert loras.ids["a"] == first_id and again.num_cached_tokens > 0  # same files, same KV
    changed = make_adapter(made / "tiny", tmp_path / "a2", seed=21, r=4)
    for f in (tmp_path / "a2").iterdir():
        shutil.copy(f, tmp_path / "a" / f.name)
    tokens, third = ask("3", "a")
    assert loras.ids["a"] != first_id and third.num_cached_tokens == 0  # new weights, new KV
    assert tokens == hf_greedy(changed, prompt, NEW)


def _last(
    core: EngineCore, rid: str, name: str, prompt: list[int]
) -> tuple[list[int], RequestOutput]:
    """Run one request; its tokens and its last output."""
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    core.add_request(EngineCoreRequest(rid, prompt, params, tenant="t", lora_name=name))
    tokens: list[int] = []
    last = None
    while core.has_work():
        outputs, _ = core.step()
        for o in (o for o in outputs if o.request_id == rid):
            tokens += o.new_token_ids
            last = o if o.finished else last
    assert last is not None and last.finish_reason is FinishReason.LENGTH, last
    return tokens, last


def test_an_evicted_adapter_whose_files_are_gone_fails_its_requests_only(
    made: Path, tmp_path: Path
) -> None:
    adapters = _copies(made, tmp_path)
    core, full = _core(made, adapters, 2), _core(made, made, None)
    loras = core.runner.loras  # type: ignore[attr-defined]
    assert not loras.registry.is_resident(loras.ids["a"])  # c and d were loaded last
    shutil.rmtree(adapters / "a")
    asks = _asks("x", ("a", "b", None))
    got, want = _run(core, asks), _run(full, asks)
    for rid, _, _ in asks:
        if "-a-" in rid:
            failed = got[rid]
            assert isinstance(failed, RequestOutput), failed
            assert "adapter 'a' cannot be served" in (failed.error or "")
            assert "cannot read the adapter config" in (failed.error or "")
        else:
            assert got[rid] == want[rid]
    assert "a" in loras.ids  # still registered: its files back, it serves again
    shutil.copytree(made / "a", adapters / "a")
    back = _asks("y", ("a",), n_prompts=1)
    assert _run(core, back) == _run(full, back)
