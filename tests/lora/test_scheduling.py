"""Scheduling with adapters: at most `max_loras` adapters run at once, the others wait their
turn in line (never fail, never overtaken), base requests are never held back by adapters."""

from __future__ import annotations

from factories import make_request, make_scheduler

from headrace.engine.messages import RequestOutput
from headrace.engine.outputs import RunnerOutput, SchedulerOutput
from headrace.request import Request


def _lora(rid: str, lora_id: int, max_tokens: int = 3) -> Request:
    req = make_request(rid, max_tokens=max_tokens, ignore_eos=True)
    req.lora_id = lora_id
    return req


def _step(sched, out: SchedulerOutput) -> list[RequestOutput]:  # type: ignore[no-untyped-def]
    sampled = {s.request_id: 7 for s in out.scheduled if s.sample}
    outputs: list[RequestOutput] = sched.update(out, RunnerOutput(sampled=sampled))
    sched.blocks.check_invariants()
    return outputs


def test_adapters_beyond_max_loras_wait_their_turn() -> None:
    sched = make_scheduler(max_loras=2, num_speculative_tokens=0)
    for req in (_lora("a1", 1), _lora("b", 2), _lora("c", 3), _lora("a2", 1), _lora("base", 0)):
        sched.add_request(req)
    out = sched.schedule()
    first = {s.request_id: s.lora_id for s in out.scheduled}
    # c's adapter would be a third: it waits, and a2 (behind it in line) waits too
    assert first == {"a1": 1, "b": 2, "base": 0}
    tokens: dict[str, int] = {}
    finished: set[str] = set()
    while sched.has_work():
        assert len({s.lora_id for s in out.scheduled if s.lora_id}) <= 2
        if any(s.request_id == "c" for s in out.scheduled):
            assert "a1" in finished or "b" in finished  # once an adapter left
        for o in _step(sched, out):
            tokens[o.request_id] = tokens.get(o.request_id, 0) + len(o.new_token_ids)
            finished |= {o.request_id} if o.finished else set()
        out = sched.schedule()
    assert tokens == {"a1": 3, "b": 3, "c": 3, "a2": 3, "base": 3}  # c waited, never failed


def test_a_waiting_adapter_is_not_overtaken_by_a_busy_one() -> None:
    """With the batch's adapters full, later requests of a running adapter wait behind the
    first waiting one: a stream of one adapter's requests cannot starve another's."""
    sched = make_scheduler(max_loras=1, num_speculative_tokens=0)
    sched.add_request(_lora("a1", 1, max_tokens=2))
    out = sched.schedule()
    for req in (_lora("c", 2), _lora("a2", 1), _lora("base", 0)):
        sched.add_request(req)
    order: list[str] = []
    while sched.has_work():
        order += [s.request_id for s in out.scheduled if s.request_id not in order]
        _step(sched, out)
        out = sched.schedule()
    assert order == ["a1", "base", "c", "a2"]
