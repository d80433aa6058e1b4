"""The front end ⇄ core boundary: every message round-trips through MessagePack unchanged, a
message of the wrong shape is refused by the decoder, a core process drops what it cannot read
and keeps serving, and the core never loads a tokenizer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import msgspec
import pytest

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.engine.messages import (
    AbortRequests,
    CoreFailed,
    CoreOutputs,
    CoreReady,
    EngineCoreRequest,
    RequestOutput,
    Shutdown,
    StepStats,
    TokenLogprobs,
    decode_from_core,
    decode_to_core,
    encode,
)
from headrace.request import FinishReason, SamplingParams

PARAMS = SamplingParams(
    max_tokens=7, temperature=0.5, top_p=0.9, seed=(1 << 64) - 1, stop=("\n", "END"),
    stop_token_ids=(3,), logprobs=2, grammar='{"type": "object"}', logit_bias=((5, -2.5),),
    bad_words=((9, 10), (11,)), min_tokens=1,
)  # fmt: skip


def test_every_message_round_trips_unchanged() -> None:
    to_core = [
        EngineCoreRequest(
            "r#1",
            [1, 2, 3],
            PARAMS,
            priority=0,
            tenant="t",
            weight=2.5,
            timeout_s=3.0,
            queue_timeout_s=1.0,
            arrival_time=12.5,
            cache_salt="s",
            eos_token_ids=(1, 106),
        ),  # fmt: skip
        AbortRequests(["a", "b"]),
        Shutdown(),
    ]
    for msg in to_core:
        assert decode_to_core(encode(msg)) == msg
    outputs = [
        RequestOutput(
            "r#1",
            [4],
            None,
            3,
            1,
            [TokenLogprobs(4, -0.25, [(4, -0.25), (8, -2.0)])],
            queue_time=0.01,
            num_cached_tokens=16,
        ),  # fmt: skip
        RequestOutput("r#2", [], FinishReason.ERROR, error="model step failed: boom"),
    ]
    stats = StepStats(0.5, 2, 1, 10, 8, 2, 5, 64, 1, 30, 40, ((0, 1, 30),), 100, 3, 48, 16)
    from_core = [
        CoreReady("m", 512, 64, 16, (1, 2), {"device": "cpu", "num_kv_blocks": 64}),
        CoreFailed("Traceback ..."),
        CoreOutputs(outputs, stats),
    ]
    for reply in from_core:
        decoded = decode_from_core(encode(reply))
        assert decoded == reply and type(decoded) is type(reply)
    got = decode_from_core(encode(CoreOutputs(outputs, stats)))
    assert isinstance(got, CoreOutputs)
    assert got.outputs[1].finish_reason is FinishReason.ERROR and got.outputs[0].finished is False


def test_the_decoder_refuses_a_message_of_the_wrong_shape() -> None:
    good = msgspec.to_builtins(EngineCoreRequest("r", [1, 2], SamplingParams()))
    assert decode_to_core(msgspec.msgpack.encode(good)) == EngineCoreRequest(
        "r", [1, 2], SamplingParams()
    )
    position = {name: i + 1 for i, name in enumerate(EngineCoreRequest.__struct_fields__)}
    for field, value in [
        ("prompt_token_ids", ["one", "two"]),
        ("weight", "heavy"),
        ("params", {"max_tokens": 0}),  # SamplingParams' own checks run on decode
        ("params", {"temperature": -1.0}),
    ]:
        bad = list(good)  # [tag, request_id, prompt_token_ids, params, ...]
        bad[position[field]] = value
        with pytest.raises(msgspec.ValidationError):
            decode_to_core(msgspec.msgpack.encode(bad))
    with pytest.raises(msgspec.ValidationError):  # a reply is not something a core takes
        decode_to_core(encode(CoreFailed("x")))
    with pytest.raises(msgspec.DecodeError):
        decode_to_core(b"\xc1 not msgpack")


def test_a_core_process_drops_unreadable_messages_and_keeps_serving(tiny_model_dir) -> None:
    model = ModelConfig(model=str(tiny_model_dir), dtype="float32", device="cpu", num_threads=1)
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)

    async def main() -> tuple[list[int], list[int], bool]:
        engine = await AsyncEngine.start(model, CacheConfig(num_kv_blocks=32), SchedulerConfig())
        try:
            ids = engine.tokenizer.encode("Hello world")
            before = [t async for c in engine.generate("a", ids, greedy) for t in c.token_ids]
            inbox = engine._conn._inbox  # type: ignore[attr-defined]  # the raw socket
            inbox.send(b"\xc1 garbage")
            inbox.send(msgspec.msgpack.encode(["request", "x", "not ids", {}]))
            after = [t async for c in engine.generate("b", ids, greedy) for t in c.token_ids]
            return before, after, engine.is_healthy
        finally:
            await engine.close()

    before, after, healthy = asyncio.run(main())
    assert len(before) == 5 and after == before and healthy


def test_the_core_never_loads_a_tokenizer(tiny_model_dir) -> None:
    """Build a core on a real model and run a request through it: neither headrace's tokenizer
    nor the `tokenizers` library is ever imported in that process."""
    script = textwrap.dedent(f"""
        import sys
        from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
        from headrace.engine.core.core_loop import CoreSpec
        from headrace.engine.messages import EngineCoreRequest
        from headrace.request import SamplingParams

        model = ModelConfig(model={str(tiny_model_dir)!r}, dtype="float32", device="cpu")
        core = CoreSpec(model, CacheConfig(num_kv_blocks=32), SchedulerConfig()).build()
        core.add_request(EngineCoreRequest("r", [5, 6, 7], SamplingParams(max_tokens=3)))
        while core.has_work():
            core.step()
        ready = core.ready_message(None)
        loaded = [m for m in sys.modules if m.startswith(("tokenizers", "headrace.loader.tok"))]
        print(sorted(loaded), len(ready.runner))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split("\n")[-2]  # fmt: skip
    assert out.startswith("[] ") and int(out.split()[-1]) > 0, out
