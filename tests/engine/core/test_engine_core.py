"""EngineCore on the fake runner: aborts, deadlines, failed steps, fair-share charging, stats."""

from __future__ import annotations

from collections import Counter

from headrace.engine.sched.waiting_queue import PriorityQueue
from headrace.request import FinishReason


def _assert_clean(engine) -> None:
    assert engine.core.block_manager.num_used_blocks == 0
    assert not engine.core.has_work()
    engine.core.block_manager.check_invariants({})


def test_aborts_while_queued_mid_prefill_mid_decode_and_in_the_final_step(
    fake_engine, fake_runner, make_prompt, fake_reference
):
    runner = fake_runner()
    engine = fake_engine(runner=runner, max_num_batched_tokens=8, max_num_seqs=2)
    kw = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    engine.add("decode", make_prompt(1, 3), **kw)
    engine.add("prefill", make_prompt(2, 30), **kw)
    engine.add("queued", make_prompt(3, 3), **kw)
    engine.step()
    engine.step()
    sched = engine.core.scheduler
    assert sched.requests["prefill"].num_computed_tokens < 30  # mid-prefill
    assert len(engine.tokens["decode"]) == 2  # mid-decode
    assert sched.requests["queued"] in list(sched.queue)
    for rid in ("decode", "prefill", "queued"):
        assert engine.core.abort_request(rid)
    engine.step()
    assert {rid: o.finish_reason for rid, o in engine.finished.items()} == {
        rid: FinishReason.ABORT for rid in ("decode", "prefill", "queued")
    }
    _assert_clean(engine)

    # The final step: the abort lands while the model computes the last token.
    engine.finished.clear()
    engine.tokens.clear()
    engine.add("decode", make_prompt(1, 3), **kw)  # ids are reusable
    for _ in range(5):
        engine.step()
    assert len(engine.tokens["decode"]) == 5
    execute = runner.execute
    runner.execute = lambda out: (engine.core.abort_request("decode"), execute(out))[1]
    engine.step()
    assert engine.finished["decode"].finish_reason is FinishReason.ABORT
    assert len(engine.tokens["decode"]) == 5  # the last token is never reported
    _assert_clean(engine)
    runner.execute = execute
    engine.tokens.clear()
    engine.add("decode", make_prompt(1, 3), **kw)
    engine.run()
    assert engine.tokens["decode"] == fake_reference(make_prompt(1, 3), _params(**kw))
    assert engine.core.abort_request("decode") is False  # finished: nothing to abort


def _params(**kw):
    from headrace.request import SamplingParams

    return SamplingParams(**kw)


def test_deadlines_end_with_timeout_and_queue_deadlines_with_overloaded(fake_engine, make_prompt):
    engine = fake_engine(max_num_seqs=1)
    engine.add("slow", make_prompt(1, 4), max_tokens=100, ignore_eos=True, timeout_s=0.0105)
    engine.add("queued", make_prompt(2, 4), max_tokens=5, queue_timeout_s=0.005)
    engine.add("patient", make_prompt(3, 4), max_tokens=5, ignore_eos=True, queue_timeout_s=1.0)
    engine.run()
    assert engine.finished["slow"].finish_reason is FinishReason.TIMEOUT
    assert 5 <= len(engine.tokens["slow"]) <= 11  # ~1 ms per fake step
    assert engine.finished["queued"].finish_reason is FinishReason.OVERLOADED
    assert "queued" not in engine.tokens or engine.tokens["queued"] == []
    assert engine.finished["patient"].finish_reason is FinishReason.LENGTH
    _assert_clean(engine)


def test_a_failed_step_errors_its_requests_and_the_engine_keeps_serving(
    fake_engine, fake_runner, make_prompt, fake_reference
):
    runner = fake_runner(fail_when=lambda out: any(s.request_id == "bad" for s in out.scheduled))
    engine = fake_engine(runner=runner, max_num_seqs=1)
    kw = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    engine.add("before", make_prompt(1, 5), **kw)
    engine.add("bad", make_prompt(2, 5), **kw)
    engine.add("after", make_prompt(3, 5), **kw)
    engine.run()
    assert engine.finished["before"].finish_reason is FinishReason.LENGTH
    assert engine.finished["bad"].finish_reason is FinishReason.ERROR
    assert "injected failure" in (engine.finished["bad"].error or "")
    assert engine.tokens["after"] == fake_reference(make_prompt(3, 5), _params(**kw))
    _assert_clean(engine)


class RecordingQueue(PriorityQueue):
    def __init__(self) -> None:
        super().__init__()
        self.charged: Counter[str] = Counter()

    def charge(self, req, num_tokens: int) -> None:
        self.charged[req.request_id] += num_tokens


def test_the_queue_is_charged_every_scheduled_token(fake_engine, fake_runner, make_prompt):
    queue = RecordingQueue()
    engine = fake_engine(
        runner=fake_runner(num_kv_blocks=10), queue=queue, max_num_batched_tokens=8
    )
    for i in range(4):
        engine.add(f"r{i}", make_prompt(i, 10), max_tokens=12, ignore_eos=True)
    engine.run()
    scheduled: Counter[str] = Counter()
    for out in engine.runner.steps:
        for s in out.scheduled:
            scheduled[s.request_id] += len(s.token_ids)
    assert queue.charged == scheduled
    assert engine.stats[-1].num_preemptions_total > 0  # recomputed tokens are charged too


def test_step_stats_report_load(fake_engine, make_prompt):
    engine = fake_engine(max_num_seqs=1, max_num_batched_tokens=4)
    engine.add("a", make_prompt(1, 10), max_tokens=5, ignore_eos=True)
    engine.add("b", make_prompt(2, 6), max_tokens=3, ignore_eos=True)
    engine.step()
    s = engine.stats[-1]
    assert (s.num_running, s.num_waiting) == (1, 1)
    assert (s.num_batched_tokens, s.num_prefill_tokens, s.num_decode_tokens) == (4, 4, 0)
    assert s.waiting_tokens == 6
    assert s.running_tokens == (10 - 4) + 5
    assert s.kv_blocks_used == 1 and s.kv_blocks_total == 64
    assert s.step_duration > 0
    engine.run()
    assert engine.stats[-1].kv_usage == 0.0


def test_deadlines_count_from_the_front_ends_arrival_time(fake_engine, make_prompt):
    engine = fake_engine(max_num_seqs=1)
    engine.now = 100.0
    engine.add("blocker", make_prompt(1, 4), max_tokens=200, ignore_eos=True)
    engine.step()  # the blocker holds the only seat
    # Arrived at the HTTP server 1 s before the core saw it: its 1.5 s run out at 100.5.
    engine.add("late", make_prompt(2, 4), max_tokens=5, queue_timeout_s=1.5, arrival_time=99.0)
    engine.add("whole", make_prompt(3, 4), max_tokens=5, timeout_s=1.2, arrival_time=99.0)
    engine.add("core-clock", make_prompt(4, 4), max_tokens=5, queue_timeout_s=1.5)
    req = engine.core.scheduler.requests["late"]
    assert req.arrival_time == 99.0 and req.queue_deadline == 100.5
    engine.now = 100.2
    engine.step()
    assert "whole" in engine.finished and "late" not in engine.finished
    assert engine.finished["whole"].finish_reason is FinishReason.TIMEOUT  # 99.0 + 1.2
    engine.now = 100.5
    engine.step()
    assert engine.finished["late"].finish_reason is FinishReason.OVERLOADED
    assert "core-clock" not in engine.finished  # counts from 100.001: until 101.501
    engine.now = 101.6
    engine.step()
    assert engine.finished["core-clock"].finish_reason is FinishReason.OVERLOADED
    # A stamp later than the core's clock (clocks that disagree) counts from now instead.
    engine.add("future", make_prompt(5, 4), max_tokens=5, arrival_time=1e9, timeout_s=3.0)
    assert engine.core.scheduler.requests["future"].deadline == engine.now + 3.0
