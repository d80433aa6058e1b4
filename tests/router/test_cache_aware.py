"""Cache-aware routing: a prompt goes where its prefix went before, and a LoRA request where
its adapter is in memory, while load allows (in process, fake replicas whose reported load and
adapters the test sets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fake_engine import FakeEngine

from headrace.config import RouterConfig
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams
from headrace.router.policies import CacheAware, Candidate
from headrace.router.prefix_index import PrefixIndex, prefix_hashes
from headrace.router.replica import Replica
from headrace.router.router import Router

SYSTEM = list(range(100, 164))  # 4 routing blocks


class LoadedEngine(FakeEngine):
    """Finishes every request at once; reports the waiting tokens the test sets."""

    def __init__(self) -> None:
        self.waiting_tokens = 0
        self.prompts: list[list[int]] = []
        self.in_memory: tuple[str, ...] = ()  # LoRA adapters whose weights it holds

    def stats(self) -> StepStats:
        adapters = tuple((a, int(a in self.in_memory), 1, 0) for a in ("a", "b"))
        return StepStats(
            waiting_tokens=self.waiting_tokens, kv_blocks_total=100, lora_adapters=adapters
        )

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        self.prompts.append(prompt)
        yield GenerationChunk(request_id, "x", [3], FinishReason.LENGTH, completion_tokens=1)


def _send(router: Router, prompt: list[int], tenant: str = "t", lora: str | None = None) -> None:
    async def go() -> None:
        options = GenerateOptions(tenant=tenant, lora=lora)
        async for _ in router.generate("r", prompt, SamplingParams(max_tokens=1), options):
            pass

    asyncio.run(go())


def _router(margin: int = 1000) -> tuple[Router, list[LoadedEngine]]:
    engines = [LoadedEngine(), LoadedEngine()]
    config = RouterConfig(replicas=2, cache_aware_margin_tokens=margin)
    router = Router("m", [Replica(f"m/{i}", e) for i, e in enumerate(engines)], config)
    return router, engines


def test_requests_sharing_a_prefix_land_on_one_replica_while_its_load_allows() -> None:
    router, engines = _router(margin=1000)
    assert router.policy.name == "cache-aware"
    for turn in range(6):
        _send(router, SYSTEM + [7, turn])
    home = 0 if engines[0].prompts else 1
    assert len(engines[home].prompts) == 6 and not engines[1 - home].prompts
    # Another system prompt finds its own home; least-load picks the idle replica for it.
    _send(router, list(range(300, 364)) + [1])
    assert len(engines[1 - home].prompts) == 1
    # The home is busier than the other, but within the margin: affinity holds.
    engines[home].waiting_tokens = 900
    _send(router, SYSTEM + [8])
    assert len(engines[home].prompts) == 7
    # Past the margin the prefix spreads to the less loaded replica.
    engines[home].waiting_tokens = 1200
    _send(router, SYSTEM + [9])
    assert len(engines[1 - home].prompts) == 2


def test_prefixes_are_per_tenant_salt_and_a_restart_forgets_them() -> None:
    router, engines = _router()
    _send(router, SYSTEM + [1], tenant="a")
    home = 0 if engines[0].prompts else 1
    _send(router, SYSTEM + [1], tenant="b")  # no affinity across tenants: least-load's turn
    assert len(engines[1 - home].prompts) == 1
    router.replicas[home].rejoin()  # as after a restart: its cache is cold
    assert len(router.replicas[home].prefixes) == 0


def test_a_lora_request_goes_where_its_adapter_is_in_memory_while_load_allows() -> None:
    router, engines = _router(margin=1000)
    engines[0].in_memory, engines[1].in_memory = ("a",), ("b",)
    engines[0].waiting_tokens = 600  # busier, within the margin
    for turn in range(4):  # new prompts each time: no prefix to follow
        _send(router, [50 + turn] * 40, lora="a")
    assert (len(engines[0].prompts), len(engines[1].prompts)) == (4, 0)
    _send(router, [90] * 40, lora="b")
    assert len(engines[1].prompts) == 1
    engines[0].waiting_tokens = 1500  # past the margin: another replica reads it from disk
    _send(router, [91] * 40, lora="a")
    assert len(engines[1].prompts) == 2
    engines[0].waiting_tokens = engines[1].waiting_tokens = 0
    engines[0].in_memory = engines[1].in_memory = ("a",)  # both hold it: least-load's turns
    for turn in range(2):
        _send(router, [70 + turn] * 40, lora="a")
    assert (len(engines[0].prompts), len(engines[1].prompts)) == (5, 3)


def test_least_load_routing_ignores_prefixes() -> None:
    engines = [LoadedEngine(), LoadedEngine()]
    config = RouterConfig(replicas=2, routing="least-load")
    router = Router("m", [Replica(f"m/{i}", e) for i, e in enumerate(engines)], config)
    for turn in range(4):
        _send(router, SYSTEM + [turn])
    assert [len(e.prompts) for e in engines] == [2, 2]  # idle replicas take turns


def test_policy_and_index_on_plain_numbers() -> None:
    policy = CacheAware(margin_tokens=100)
    c = [Candidate(0, 50, 10, 0, prefix_blocks=0), Candidate(1, 140, 10, 0, prefix_blocks=3)]
    assert policy.choose(c).index == 1  # 90 tokens above the least loaded: within the margin
    c[1] = Candidate(1, 151, 10, 0, prefix_blocks=3)
    assert policy.choose(c).index == 0
    c = [Candidate(0, 50, 10, 0), Candidate(1, 140, 10, 0, holds_adapter=True)]
    assert policy.choose(c).index == 1  # its adapter in memory, within the margin
    c[1] = Candidate(1, 151, 10, 0, holds_adapter=True)
    assert policy.choose(c).index == 0
    index = PrefixIndex(max_blocks=4)
    a, b = prefix_hashes(SYSTEM, "s"), prefix_hashes(SYSTEM + SYSTEM, "s")
    assert len(a) == 4 and b[:4] == a and prefix_hashes(SYSTEM, "other")[0] != a[0]
    index.record(a)
    assert index.match(b) == 4 and index.match(prefix_hashes(SYSTEM, "other")) == 0
    index.record(b[4:6])  # over the bound: the least recently used blocks go first
    assert len(index) == 4 and index.match(a) == 0
    assert prefix_hashes(SYSTEM[:15], "s") == []
