"""Background requests (the batch tier's priority, 2, and less urgent) sit out the step that
computes a more urgent request's prompt, and only that step; when that prompt cannot start
they run as before; at most MOST_IN_A_ROW steps in a row; `--background-priority 10` turns it
off. Outputs never change."""

from __future__ import annotations

from headrace.engine.sched.background import MOST_IN_A_ROW
from headrace.request import SamplingParams


def _ids(engine) -> set[str]:
    return {s.request_id for s in engine.runner.steps[-1].scheduled}


def _batch_then_paid(engine, make_prompt, paid_priority: int = 0) -> None:
    for rid in ("b1", "b2"):
        engine.add(rid, make_prompt(hash(rid) % 97, 6), max_tokens=20, priority=2,
                   temperature=0, ignore_eos=True)  # fmt: skip
    engine.step()  # both prompts
    engine.step()  # both decode
    assert _ids(engine) == {"b1", "b2"}
    engine.add("p", make_prompt(5, 12), max_tokens=4, priority=paid_priority, temperature=0,
               ignore_eos=True)  # fmt: skip


def test_background_sits_out_the_step_of_an_urgent_prompt(fake_engine, make_prompt, fake_reference):
    engine = fake_engine(max_num_batched_tokens=64, burst_batched_tokens=64)
    _batch_then_paid(engine, make_prompt)
    engine.step()
    assert _ids(engine) == {"p"}  # the paid prompt's step carries no batch line
    engine.step()
    assert _ids(engine) == {"p", "b1", "b2"}  # then all decode together again
    engine.run()
    for rid, n in (("b1", 20), ("b2", 20), ("p", 4)):
        prompt = make_prompt(hash(rid) % 97, 6) if rid != "p" else make_prompt(5, 12)
        want = fake_reference(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        assert engine.tokens[rid] == want, rid


def test_a_free_request_counts_as_urgent_and_the_setting_turns_it_off(fake_engine, make_prompt):
    engine = fake_engine(max_num_batched_tokens=64, burst_batched_tokens=64)
    _batch_then_paid(engine, make_prompt, paid_priority=1)
    engine.step()
    assert _ids(engine) == {"p"}
    off = fake_engine(max_num_batched_tokens=64, burst_batched_tokens=64, background_priority=10)
    _batch_then_paid(off, make_prompt)
    off.step()
    assert _ids(off) == {"p", "b1", "b2"}


def test_background_runs_when_the_urgent_prompt_cannot_start(fake_engine, make_prompt):
    # two sequences at most, both held by batch lines that may not be preempted: the paid
    # request waits, and the lines must go on (else nothing would ever run)
    engine = fake_engine(max_num_seqs=2, max_preemptions=0)
    _batch_then_paid(engine, make_prompt)
    engine.step()
    assert _ids(engine) == {"b1", "b2"}
    engine.run()
    assert set(engine.finished) == {"b1", "b2", "p"}
    assert engine.core.block_manager.num_used_blocks == 0


def test_under_a_stream_of_urgent_prompts_background_still_runs(fake_engine, make_prompt):
    # a 16-token budget and 100-token paid prompts: every step has an urgent prompt to compute
    engine = fake_engine(max_num_batched_tokens=16, burst_batched_tokens=16)
    _batch_then_paid(engine, make_prompt)
    for i in range(3):
        engine.add(f"p{i}", make_prompt(40 + i, 100), max_tokens=2, priority=0, temperature=0)
    carried = []
    for _ in range(15):
        engine.step()
        carried.append(bool({"b1", "b2"} & _ids(engine)))
    runs, run = [], 0
    for c in carried:
        run = 0 if c else run + 1
        runs.append(run)
    assert max(runs) == MOST_IN_A_ROW  # sat out, but never more than this many steps in a row
    assert sum(carried) >= 2
    engine.run()
    assert {"b1", "b2", "p", "p0", "p1", "p2"} <= set(engine.finished)
