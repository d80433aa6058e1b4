"""An engine core with adapters: `--lora` at start, a request's adapter by name, its cache salt,
and an unload that ends the adapter's requests (never the others'); the offline LLM's `lora`."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import hf_greedy, make_tiny, prompts
from factories.lora import make_adapter

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.llm import LLM
from headrace.engine.messages import EngineCoreRequest, LoraCommand, StepStats
from headrace.metrics.engine_collector import EngineCollector
from headrace.request import FinishReason, SamplingParams
from headrace.router.load import sum_stats


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> EngineCore:
    tmp = tmp_path_factory.mktemp("lora-engine")
    make_tiny("llama", tmp / "tiny")
    make_adapter(tmp / "tiny", tmp / "a", seed=1)
    model = ModelConfig(model=str(tmp / "tiny"), dtype="float32", lora=(f"a={tmp / 'a'}",))
    return EngineCore.from_configs(
        model, CacheConfig(block_size=4, num_kv_blocks=128), SchedulerConfig()
    )


def _request(rid: str, lora: str | None) -> EngineCoreRequest:
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    return EngineCoreRequest(rid, prompts(1)[0], params, tenant="t", lora_name=lora)


def test_adapter_by_name_salted_and_unloaded_under_way(core: EngineCore) -> None:
    with pytest.raises(ValueError, match="adapter 'nope' is not loaded"):
        core.add_request(_request("x", "nope"))
    core.add_request(_request("base", None))
    core.add_request(_request("with-a", "a"))
    assert core.stats().lora_requests == (("a", 0, 1, 0),)  # name, running, waiting, tokens
    reqs = core.scheduler.requests
    assert reqs["base"].cache_salt == "t" and reqs["base"].lora_id == 0
    assert reqs["with-a"].cache_salt.startswith("t\x00lora:") and reqs["with-a"].lora_id > 0
    for _ in range(3):
        _, stats = core.step()
    [(name, running, waiting, tokens)] = stats.lora_requests
    assert (name, running, waiting) == ("a", 1, 0) and tokens >= 3 + 2  # prompt, 2 decodes
    done = core.apply_lora(LoraCommand("c1", "a"))
    assert done.error is None
    outputs, _ = core.step()
    ended = {o.request_id: o for o in outputs if o.finished}
    assert ended["with-a"].finish_reason is FinishReason.ERROR
    assert "'a' was unloaded" in (ended["with-a"].error or "")
    assert "base" in core.scheduler.requests  # the base request goes on
    assert core.stats().lora_requests == ()
    assert core.apply_lora(LoraCommand("c2", "a")).error == "adapter 'a' is not loaded"
    refused = core.apply_lora(LoraCommand("c3", "b", "/nowhere"))
    assert refused.error is not None and "cannot read the adapter config" in refused.error


def test_per_adapter_counts_add_up_over_replicas_and_reach_prometheus() -> None:
    one = StepStats(num_running=2, lora_requests=(("a", 1, 0, 10), ("b", 0, 2, 0)))
    two = StepStats(num_running=1, lora_requests=(("a", 2, 1, 5),))
    total = sum_stats([one, two])
    assert total.lora_requests == (("a", 3, 1, 15), ("b", 0, 2, 0)) and total.num_running == 3

    class Engine:
        def stats(self) -> StepStats:
            return total

    text = "".join(
        f"{m.name}{s.labels} {s.value}\n"
        for m in EngineCollector(lambda: {"tiny": Engine()}).collect()  # type: ignore[dict-item]
        for s in m.samples
    )
    assert "headrace:lora_requests_running{'model_name': 'tiny', 'lora_name': 'a'} 3" in text
    assert "headrace:lora_requests_waiting{'model_name': 'tiny', 'lora_name': 'b'} 2" in text
    assert "headrace:lora_tokens_computed{'model_name': 'tiny', 'lora_name': 'a'} 15" in text


def test_drafts_of_an_adapter_request_are_checked_with_its_adapter(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Speculation on or off, an adapter's greedy request says the same (its draft rows run
    through the adapter too), and drafts were in fact checked."""
    tmp = tmp_path_factory.mktemp("lora-spec")
    make_tiny("llama", tmp / "tiny")
    make_adapter(tmp / "tiny", tmp / "a", seed=4)
    model = ModelConfig(model=str(tmp / "tiny"), dtype="float32", lora=(f"a={tmp / 'a'}",))
    prompt = prompts(1)[0][:6] * 5  # repeats: prompt lookup finds drafts
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    runs = {}
    for k in (0, 8):
        core = EngineCore.from_configs(
            model, CacheConfig(block_size=4, num_kv_blocks=128),
            SchedulerConfig(num_speculative_tokens=k),
        )  # fmt: skip
        core.add_request(EngineCoreRequest("r", prompt, params, lora_name="a"))
        tokens: list[int] = []
        while core.has_work():
            outputs, stats = core.step()
            tokens += [t for o in outputs for t in o.new_token_ids]
        runs[k] = (tokens, stats.spec_draft_tokens_total)
    assert len(runs[0][0]) == 40 and runs[8][0] == runs[0][0]
    assert runs[8][1] > 0


def test_the_offline_llm_takes_an_adapter_by_name(tmp_path: Path) -> None:
    """`LLM.generate(..., lora=NAME)`: the adapter's tokens (transformers + peft's), the base's
    without it."""
    make_tiny("llama", tmp_path / "tiny")
    peft_model = make_adapter(tmp_path / "tiny", tmp_path / "a", seed=3)
    llm = LLM(ModelConfig(model=str(tmp_path / "tiny"), dtype="float32"))
    llm.core.runner.loras.load("a", tmp_path / "a")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = prompts(1)[0]
    with_a = llm.generate([prompt], params, lora="a")[0].token_ids
    assert with_a == hf_greedy(peft_model, prompt, 8)
    assert llm.generate([prompt], params)[0].token_ids != with_a
    with pytest.raises(ValueError, match="adapter 'b' is not loaded"):
        llm.generate([prompt], params, lora="b")
