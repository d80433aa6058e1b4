"""--async-scheduling (engine/core/overlap.py) on the fake runner: the next step is scheduled
and launched before this one's tokens are read, and every request still gets the tokens it
gets alone; stops, aborts, deadlines, preemption, a failing step and drafts on the way."""

from __future__ import annotations

import random

from factories import FAKE_EOS, FakeCore, FakeLaunchingRunner, fake_reference, make_prompt

from headrace.engine.core.overlap import with_tokens
from headrace.engine.outputs import LogitsInputs, ScheduledRequest, SchedulerOutput
from headrace.engine.sched.overlappable import overlappable
from headrace.request import PENDING_TOKEN, FinishReason, SamplingParams


def _engine(runner: FakeLaunchingRunner | None = None, **cfg: object) -> FakeCore:
    cfg.setdefault("num_speculative_tokens", 0)
    runner = runner or FakeLaunchingRunner(poison_full_blocks=True)
    return FakeCore(runner=runner, async_scheduling=True, **cfg)


def _assert_clean(engine: FakeCore) -> None:
    assert engine.core.block_manager.num_used_blocks == 0
    assert not engine.core.has_work() and not engine.core.in_flight
    assert not engine.core.scheduler.requests
    engine.core.block_manager.check_invariants({})


def _run(engine: FakeCore, arrivals: dict[int, list[tuple[str, list[int], dict]]]) -> None:
    step = 0
    while engine.core.has_work() or any(s >= step for s in arrivals):
        for rid, prompt, kw in arrivals.get(step, []):
            engine.add(rid, prompt, **kw)
        engine.step()
        step += 1
    _assert_clean(engine)


def _stop_after(prompt: list[int], kw: dict, k: int) -> dict:
    """`kw` with a stop token that ends the request at its k-th token (one it never gave
    before then), or `kw` unchanged where there is none."""
    ref = fake_reference(prompt, SamplingParams(**kw))
    if len(ref) > k and ref[k - 1] not in ref[: k - 1] and ref[k - 1] != FAKE_EOS:
        return {**kw, "stop_token_ids": (ref[k - 1],)}
    return kw


def test_overlapped_steps_give_every_request_its_solo_tokens():
    runner = FakeLaunchingRunner(poison_full_blocks=True)
    engine = _engine(runner, max_num_batched_tokens=32, max_num_seqs=8)
    rng = random.Random(3)
    arrivals: dict[int, list[tuple[str, list[int], dict]]] = {}
    wanted = {}
    for i in range(32):
        prompt = make_prompt(i, rng.choice([1, 3, 9, 30, 50]))
        kw = {
            "max_tokens": rng.randint(1, 24),
            "temperature": 0.0 if i % 2 else 0.8,
            "seed": None if i % 2 else 100 + i,
            "ignore_eos": i % 3 == 0,
        }
        if i % 4 == 1:
            kw = _stop_after(prompt, kw, rng.randint(2, 6))
        arrivals.setdefault(rng.randrange(0, 30), []).append((f"r{i}", prompt, kw))
        wanted[f"r{i}"] = fake_reference(prompt, SamplingParams(**kw))
    _run(engine, arrivals)
    assert engine.tokens == wanted
    assert runner.filled > 100  # most decodes took the token of a step still in flight
    stops = [o for o in engine.finished.values() if o.finish_reason is FinishReason.STOP]
    assert len(stops) >= 4


def test_a_length_limit_costs_no_row_and_a_stop_token_one():
    runner = FakeLaunchingRunner(poison_full_blocks=True)
    engine = _engine(runner)
    prompt = make_prompt(7, 5)
    long = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    stopped = _stop_after(prompt, {**long, "ignore_eos": False, "max_tokens": 40}, 6)
    assert "stop_token_ids" in stopped
    _run(engine, {0: [("long", prompt, long), ("stop", prompt, stopped)]})
    rows = {"long": 0, "stop": 0}
    for out in runner.launches:
        for s in out.scheduled:
            rows[s.request_id] += s.sample
    assert len(engine.tokens["long"]) == 12 and rows["long"] == 12
    assert len(engine.tokens["stop"]) == 6 and rows["stop"] == 7  # the row after its stop
    assert engine.finished["stop"].finish_reason is FinishReason.STOP


def test_preemption_with_a_step_in_flight_recomputes_exactly():
    runner = FakeLaunchingRunner(num_kv_blocks=14, block_size=4, poison_full_blocks=True)
    engine = _engine(runner, max_num_batched_tokens=16)
    kw = {"max_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    sampled = {**kw, "temperature": 1.0, "seed": 5}
    reqs = [(f"p{i}", make_prompt(20 + i, 8), sampled if i % 2 else kw) for i in range(6)]
    _run(engine, {0: reqs})
    for rid, prompt, params in reqs:
        assert engine.tokens[rid] == fake_reference(prompt, SamplingParams(**params)), rid
    assert engine.stats[-1].num_preemptions_total >= 2
    assert runner.filled > 20


def test_aborts_and_deadlines_end_a_request_whose_token_is_in_flight():
    runner = FakeLaunchingRunner(poison_full_blocks=True)
    engine = _engine(runner, max_num_seqs=4)
    kw = {"max_tokens": 30, "temperature": 0.0, "ignore_eos": True}
    prompts = {rid: make_prompt(i, 6) for i, rid in enumerate(("a", "b", "late", "other"))}
    for rid in ("a", "b", "other"):
        engine.add(rid, prompts[rid], **kw)
    engine.add("late", prompts["late"], timeout_s=0.0065, **kw)  # FakeCore's clock: 1 ms a step
    for _ in range(4):
        engine.step()
    assert engine.core.in_flight and engine.core.scheduler.requests["a"].pending
    assert engine.core.abort_request("a")
    engine.step()
    assert engine.finished["a"].finish_reason is FinishReason.ABORT
    engine.core.abort_request("b")
    engine.run()
    assert engine.finished["b"].finish_reason is FinishReason.ABORT
    assert engine.finished["late"].finish_reason is FinishReason.TIMEOUT
    for rid in ("a", "b", "late"):
        ref = fake_reference(prompts[rid], SamplingParams(**kw))
        assert (
            0 < len(engine.tokens[rid]) < 30
            and engine.tokens[rid] == ref[: len(engine.tokens[rid])]
        )
        assert engine.finished[rid].num_output_tokens == len(engine.tokens[rid])  # no placeholder
    assert engine.tokens["other"] == fake_reference(prompts["other"], SamplingParams(**kw))
    _assert_clean(engine)


def test_a_step_that_fails_at_launch_behind_one_in_flight_fails_only_its_culprit():
    prompt = make_prompt(1, 4)

    def poisoned(out: SchedulerOutput) -> bool:
        return any(s.request_id == "bad" and s.start_pos >= 9 for s in out.scheduled)

    runner = FakeLaunchingRunner(poison_full_blocks=True, fail_when=poisoned)
    engine = _engine(runner)
    kw = {"max_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    good = [(f"g{i}", make_prompt(10 + i, 4), kw) for i in range(3)]
    _run(engine, {0: [("bad", prompt, kw), *good]})
    assert engine.finished["bad"].finish_reason is FinishReason.ERROR
    # its tokens up to the step at position 9 (prompt 4 + 5 tokens): the sixth is the last
    assert engine.tokens["bad"] == fake_reference(prompt, SamplingParams(**kw))[:6]
    for rid, p, params in good:
        assert engine.tokens[rid] == fake_reference(p, SamplingParams(**params))
    assert runner.filled > 10


def test_steps_run_in_series_while_few_requests_speculate_and_logprobs_overlap():
    runner = FakeLaunchingRunner(poison_full_blocks=True)
    engine = _engine(runner, num_speculative_tokens=4, speculative_max_seqs=2)
    greedy = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    first = [("a", make_prompt(1, 9), greedy), ("b", make_prompt(2, 7), greedy)]
    more = [(f"m{i}", make_prompt(30 + i, 5), {**greedy, "max_tokens": 8}) for i in range(3)]
    lp = [("lp", make_prompt(3, 5), {**greedy, "max_tokens": 6, "logprobs": 1})]
    arrivals = {0: first, 4: more, 14: lp}
    flights: list[tuple[int, bool]] = []  # (running requests, a step left in flight)
    step = 0
    while engine.core.has_work() or step <= 14:
        for rid, prompt, kw in arrivals.get(step, []):
            engine.add(rid, prompt, **kw)
        engine.step()
        flights.append((len(engine.core.scheduler.running), engine.core.in_flight))
        step += 1
    _assert_clean(engine)
    for rid, prompt, kw in first + more + lp:
        assert engine.tokens[rid] == fake_reference(prompt, SamplingParams(**kw)), rid
    assert not any(flying for _, flying in flights[:4])  # two running: drafts may come
    assert any(flying for running, flying in flights if running > 2)
    lp_steps = [out for out in runner.steps if any(s.request_id == "lp" for s in out.scheduled)]
    # logprobs travel with the tokens (runner/logprobs.py): their steps may overlap
    assert len(lp_steps) == 6 and any(overlappable(out) for out in lp_steps)


def test_drain_lands_the_step_in_flight():
    engine = _engine()
    kw = {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True}
    prompt = make_prompt(4, 3)
    engine.add("d", prompt, **kw)
    engine.step()
    assert engine.core.in_flight
    landed = engine.core.drain()
    assert [o.new_token_ids for o in landed] == [fake_reference(prompt, SamplingParams(**kw))[:1]]
    assert not engine.core.in_flight and engine.core.drain() == []
    engine.tokens["d"] = landed[0].new_token_ids
    engine.run()
    assert engine.tokens["d"] == fake_reference(prompt, SamplingParams(**kw))
    _assert_clean(engine)


def test_with_tokens_fills_each_placeholder_and_leaves_the_rest():
    params = SamplingParams(max_tokens=4)
    a = ScheduledRequest("a", [PENDING_TOKEN], 5, [0, 1], True, params, 1)
    b = ScheduledRequest("b", [7, 8], 0, [2], True, params, 0)
    c = ScheduledRequest("c", [PENDING_TOKEN], 3, [3], True, params, 1)  # it got no token
    penalized = SamplingParams(max_tokens=4, presence_penalty=1.0)
    history = LogitsInputs([3, 9, PENDING_TOKEN], [], ())  # a penalty's, its last in flight
    d = ScheduledRequest("d", [PENDING_TOKEN], 6, [4], True, penalized, 3, history)
    out = with_tokens(SchedulerOutput([a, b, c, d], ["x"]), {"a": 42, "d": 5})
    assert [s.token_ids for s in out.scheduled] == [[42], [7, 8], [0], [5]]
    assert out.finished_ids == ["x"] and out.scheduled[1] is b
    # the step run again in series: its processors read the token, not the placeholder
    assert out.scheduled[3].logits_inputs == LogitsInputs([3, 9, 5], [], ())


def test_an_id_reused_while_its_old_step_is_in_flight_gets_only_its_own_tokens():
    engine = _engine()
    kw = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    old, new = make_prompt(1, 5), make_prompt(2, 9)
    engine.add("a", old, **kw)
    engine.add("b", make_prompt(3, 4), **kw)
    for _ in range(3):
        engine.step()
    assert engine.core.in_flight
    engine.core.abort_request("a")
    engine.add("a", new, **kw)  # the old one's token is still in flight: that step lands first
    assert not engine.core.in_flight
    engine.tokens["a"] = []
    engine.run()
    assert engine.tokens["a"] == fake_reference(new, SamplingParams(**kw))
    assert engine.tokens["b"] == fake_reference(make_prompt(3, 4), SamplingParams(**kw))
    _assert_clean(engine)


def test_a_request_at_its_limit_sits_out_the_pass_that_background_requests_get_back():
    runner = FakeLaunchingRunner(poison_full_blocks=True)
    engine = _engine(runner, max_num_seqs=2, max_preemptions=0)  # the urgent one waits
    short = {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    engine.add("r", make_prompt(1, 3), priority=1, **short)
    engine.add("batch", make_prompt(2, 3), priority=2, max_tokens=30, temperature=0.0)
    for _ in range(3):
        engine.step()
    engine.add("urgent", make_prompt(3, 6), priority=0, **short)  # no seat: both passes run
    engine.run()
    rows = sum(s.sample for out in runner.launches for s in out.scheduled if s.request_id == "r")
    assert len(engine.tokens["r"]) == 4 and rows == 4
    assert engine.tokens["urgent"] == fake_reference(make_prompt(3, 6), SamplingParams(**short))


def test_which_steps_overlap_row_by_row():
    def row(sample: bool = True, drafts: tuple[int, ...] = (), inputs: bool = False, **kw: object):
        params = SamplingParams(max_tokens=8, **kw)  # type: ignore[arg-type]
        logits = LogitsInputs([], [], (0,)) if inputs else None
        tokens = [5] if sample else [5, 6]
        return ScheduledRequest("r", tokens, 3, [1], sample, params, 1, logits, list(drafts))

    def steps(*rows: ScheduledRequest) -> bool:
        return overlappable(SchedulerOutput([row(), *rows]))

    assert steps() and not overlappable(SchedulerOutput([]))
    assert steps(row(min_tokens=2))  # past min_tokens its processor bans nothing
    assert steps(row(min_tokens=2, inputs=True))  # ... until then its bans run on the device
    assert steps(row(logit_bias=((3, 1.0),), inputs=True))  # so does a bias
    assert steps(row(presence_penalty=0.5, inputs=True))  # counted on the device
    assert steps(row(bad_words=((4, 5),), inputs=True))  # its last token's ban on the device
    assert steps(row(logprobs=1)) and not steps(row(grammar='start: "a"'))
    assert steps(row(sample=False, logprobs=1, presence_penalty=0.5))  # a prompt chunk
    assert not steps(row(drafts=(4,)))
