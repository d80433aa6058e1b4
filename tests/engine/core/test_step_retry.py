"""A failing model step is retried without its culprit; anything one request raises inside the
core ends that request with `error`, never the core."""

from __future__ import annotations

import math

import pytest

from headrace.engine.core.core_loop import run_core_loop
from headrace.engine.core.step_retry import execute_isolating_failures
from headrace.engine.messages import (
    AbortRequests,
    CoreOutputs,
    EngineCoreRequest,
    Shutdown,
    TokenLogprobs,
)
from headrace.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput
from headrace.engine.sched.waiting_queue import PriorityQueue
from headrace.request import FinishReason, SamplingParams

GREEDY = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
GOOD = [f"good{i}" for i in range(8)]


def _poisoned(out: SchedulerOutput) -> bool:
    return any(s.request_id == "bad" for s in out.scheduled)


def _assert_clean(engine) -> None:
    assert not engine.core.has_work()
    assert engine.core.block_manager.num_used_blocks == 0
    engine.core.block_manager.check_invariants({})


def test_a_poisoned_request_fails_alone_and_the_batch_gets_its_tokens_in_the_same_step(
    fake_engine, fake_runner, make_prompt, fake_reference
):
    runner = fake_runner(fail_when=_poisoned)
    engine = fake_engine(runner=runner)
    for i, rid in enumerate(GOOD[:4]):
        engine.add(rid, make_prompt(i, 5 + i), **GREEDY)
    engine.add("bad", make_prompt(99, 7), **GREEDY)
    for i, rid in enumerate(GOOD[4:], start=4):
        engine.add(rid, make_prompt(i, 5 + i), **GREEDY)
    engine.step()  # FakeCore checks the block invariants after every step
    assert {rid: len(engine.tokens[rid]) for rid in GOOD} == dict.fromkeys(GOOD, 1)
    assert engine.finished["bad"].finish_reason is FinishReason.ERROR
    assert "injected failure" in (engine.finished["bad"].error or "")
    assert engine.tokens["bad"] == []
    assert len(runner.steps) > 2  # the full step, then its halves
    engine.run()
    for i, rid in enumerate(GOOD):
        assert engine.tokens[rid] == fake_reference(make_prompt(i, 5 + i), SamplingParams(**GREEDY))
        assert engine.finished[rid].finish_reason is FinishReason.LENGTH
    _assert_clean(engine)
    engine.add("after", make_prompt(50, 6), **GREEDY)  # the core keeps going
    engine.run()
    assert engine.tokens["after"] == fake_reference(make_prompt(50, 6), SamplingParams(**GREEDY))
    _assert_clean(engine)


def _sched(ids: list[str]) -> SchedulerOutput:
    scheduled = [ScheduledRequest(rid, [1], 0, [0], True, SamplingParams(), 0) for rid in ids]
    return SchedulerOutput(scheduled, finished_ids=["gone"])


def test_bisect_merges_the_halves_and_sends_finished_ids_until_a_sub_step_succeeds() -> None:
    calls: list[tuple[list[str], list[str]]] = []

    def execute(out: SchedulerOutput) -> RunnerOutput:
        ids = [s.request_id for s in out.scheduled]
        calls.append((ids, list(out.finished_ids)))
        if "bad" in ids:
            raise RuntimeError("poisoned")
        lps = {rid: TokenLogprobs(7, -0.5, []) for rid in ids}
        return RunnerOutput({rid: 7 for rid in ids}, lps)

    culprits: list[tuple[str, str]] = []
    ids = ["bad", "a", "b", "c", "d"]
    result = execute_isolating_failures(
        execute, _sched(ids), lambda rid, e: culprits.append((rid, str(e)))
    )
    assert culprits == [("bad", "poisoned")]
    assert result.sampled == dict.fromkeys(["a", "b", "c", "d"], 7)
    assert set(result.logprobs) == {"a", "b", "c", "d"}
    ok_runs = [run for run, _ in calls if "bad" not in run]
    assert sorted(rid for run in ok_runs for rid in run) == ["a", "b", "c", "d"]  # each once
    assert len(calls) <= 1 + 2 * math.ceil(math.log2(len(ids)))
    # The failing runs carried the finished ids; the first run that succeeded took them last.
    first_ok = next(i for i, (run, _) in enumerate(calls) if "bad" not in run)
    assert all(fin == ["gone"] for _, fin in calls[: first_ok + 1])
    assert all(fin == [] for _, fin in calls[first_ok + 1 :])
    # A step with no culprit runs once, as it is.
    calls.clear()
    assert execute_isolating_failures(execute, _sched(["a", "b"]), lambda *_: None).sampled
    assert calls == [(["a", "b"], ["gone"])]


def test_every_request_failing_fails_each_once_and_the_core_keeps_serving(
    fake_engine, fake_runner, make_prompt
):
    broken = {"on": True}
    engine = fake_engine(runner=fake_runner(fail_when=lambda out: broken["on"]))
    for i in range(5):
        engine.add(f"r{i}", make_prompt(i, 4), **GREEDY)
    engine.step()
    assert sorted(engine.finished) == [f"r{i}" for i in range(5)]
    assert all(o.finish_reason is FinishReason.ERROR for o in engine.finished.values())
    _assert_clean(engine)
    broken["on"] = False
    engine.add("ok", make_prompt(9, 4), **GREEDY)
    engine.run()
    assert engine.finished["ok"].finish_reason is FinishReason.LENGTH


class _Boom:
    """A sampled "token" whose comparison raises: a bug in the runner's output."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("not a token")

    __hash__ = object.__hash__


def test_a_bad_runner_output_fails_only_its_request(fake_engine, fake_runner, make_prompt):
    runner = fake_runner()
    execute = runner.execute

    def execute_with_a_bad_token(out: SchedulerOutput) -> RunnerOutput:
        result = execute(out)
        if "bad" in result.sampled:
            result.sampled["bad"] = _Boom()  # type: ignore[assignment]
        return result

    runner.execute = execute_with_a_bad_token
    engine = fake_engine(runner=runner)
    engine.add("a", make_prompt(1, 4), **GREEDY)
    engine.add("bad", make_prompt(2, 4), stop_token_ids=(3,), **GREEDY)  # compares the token
    engine.add("b", make_prompt(3, 4), **GREEDY)
    engine.step()
    assert engine.finished["bad"].finish_reason is FinishReason.ERROR
    assert "not a token" in (engine.finished["bad"].error or "")
    assert len(engine.tokens["a"]) == len(engine.tokens["b"]) == 1
    engine.run()
    assert engine.finished["a"].finish_reason is engine.finished["b"].finish_reason
    assert engine.finished["a"].finish_reason is FinishReason.LENGTH
    _assert_clean(engine)


class _ChargeFails(PriorityQueue):
    """A waiting queue whose fair-share hook breaks on one tenant (as a weight of 0 did)."""

    def charge(self, req, num_tokens: int) -> None:
        if req.tenant == "evil":
            raise ZeroDivisionError("float division by zero")


def test_a_scheduling_error_fails_the_requests_involved_and_the_core_keeps_going(
    fake_engine, make_prompt, fake_reference
):
    engine = fake_engine(queue=_ChargeFails())
    engine.add("evil", make_prompt(1, 4), tenant="evil", **GREEDY)
    engine.step()
    assert engine.finished["evil"].finish_reason is FinishReason.ERROR
    assert "ZeroDivisionError" in (engine.finished["evil"].error or "")
    _assert_clean(engine)
    engine.add("after", make_prompt(2, 4), **GREEDY)
    engine.run()
    assert engine.tokens["after"] == fake_reference(make_prompt(2, 4), SamplingParams(**GREEDY))
    _assert_clean(engine)


def _smuggled(**fields: object) -> SamplingParams:
    """Params that skipped validation, as an unpickled message does."""
    params = SamplingParams(**GREEDY)
    for name, value in fields.items():
        object.__setattr__(params, name, value)
    return params


class _RaisingQueue(PriorityQueue):
    def add(self, req) -> None:
        if req.tenant == "boom":
            raise RuntimeError("queue is broken")
        super().add(req)


def test_bad_requests_end_with_error_and_the_core_loop_goes_on(fake_engine, make_prompt):
    engine = fake_engine(queue=_RaisingQueue())
    good = EngineCoreRequest("good", make_prompt(1, 5), SamplingParams(**GREEDY))
    inbox: list[list[object]] = [
        [
            EngineCoreRequest("weight0", make_prompt(2, 5), SamplingParams(**GREEDY), weight=0.0),
            EngineCoreRequest("nan", make_prompt(3, 5), _smuggled(temperature=math.nan)),
            EngineCoreRequest("seed", make_prompt(4, 5), _smuggled(seed=1.5)),
            EngineCoreRequest("neg-timeout", make_prompt(5, 5), SamplingParams(), timeout_s=-1.0),
            EngineCoreRequest("boom", make_prompt(6, 5), SamplingParams(), tenant="boom"),
        ],
        [good],
    ]
    sent: list[CoreOutputs] = []

    def recv(timeout: float) -> list[object]:
        if inbox:
            return inbox.pop(0)
        done = any(o.request_id == "good" and o.finished for c in sent for o in c.outputs)
        return [Shutdown()] if done else []

    run_core_loop(engine.core, recv, lambda msg: sent.append(msg))  # type: ignore[arg-type]
    finished = {o.request_id: o for c in sent for o in c.outputs if o.finished}
    errors = {rid: o.error for rid, o in finished.items() if o.finish_reason is FinishReason.ERROR}
    assert set(errors) == {"weight0", "nan", "seed", "neg-timeout", "boom"}
    assert "weight" in (errors["weight0"] or "") and "temperature" in (errors["nan"] or "")
    assert "seed" in (errors["seed"] or "") and "timeout_s" in (errors["neg-timeout"] or "")
    assert "queue is broken" in (errors["boom"] or "")
    assert finished["good"].finish_reason is FinishReason.LENGTH
    assert not engine.core.has_work()
    engine.core.block_manager.check_invariants({})


def test_an_abort_that_raises_is_logged_and_the_loop_goes_on(fake_engine, make_prompt) -> None:
    engine = fake_engine()
    calls = []

    def broken_abort(rid: str) -> bool:
        calls.append(rid)
        raise RuntimeError("abort is broken")

    engine.core.abort_request = broken_abort  # type: ignore[method-assign]
    msgs: list[list[object]] = [[AbortRequests(["x", "y"])], [Shutdown()]]
    run_core_loop(engine.core, lambda t: msgs.pop(0), lambda m: None)
    assert calls == ["x", "y"]


@pytest.mark.parametrize("weight", [0.0, -1.0, math.inf, math.nan])
def test_a_core_refuses_bad_weights_at_the_door(fake_engine, make_prompt, weight) -> None:
    engine = fake_engine()
    with pytest.raises(ValueError, match="weight"):
        engine.add("w", make_prompt(1, 4), weight=weight, **GREEDY)
    assert not engine.core.has_work()


def test_an_update_that_breaks_down_fails_its_step_and_the_core_keeps_going(
    fake_engine, make_prompt, fake_reference
):
    engine = fake_engine()
    sched = engine.core.scheduler
    update = sched.update

    def broken_update(out, result):
        raise RuntimeError("update is broken")

    engine.add("a", make_prompt(1, 4), **GREEDY)
    engine.add("b", make_prompt(2, 4), **GREEDY)
    sched.update = broken_update  # type: ignore[method-assign]
    engine.step()
    sched.update = update  # type: ignore[method-assign]
    assert {rid: o.finish_reason for rid, o in engine.finished.items()} == {
        "a": FinishReason.ERROR, "b": FinishReason.ERROR,
    }  # fmt: skip
    assert "update is broken" in (engine.finished["a"].error or "")
    _assert_clean(engine)
    engine.add("c", make_prompt(3, 4), **GREEDY)
    engine.run()
    assert engine.tokens["c"] == fake_reference(make_prompt(3, 4), SamplingParams(**GREEDY))
