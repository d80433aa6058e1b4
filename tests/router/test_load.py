"""The live load account: reports plus requests dispatched since (pure)."""

from __future__ import annotations

from headrace.engine.messages import StepStats
from headrace.router.load import SETTLE_REPORTS, LoadTracker, sum_stats


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_replica_yet_to_report_wins_ties() -> None:
    before_first_report = StepStats()
    fresh, old = LoadTracker(before_first_report), LoadTracker()
    fresh.observe(before_first_report)  # the same object again: still no report
    old.observe(StepStats(kv_blocks_total=64))
    assert (fresh.reports, old.reports) == (0, 1)
    assert fresh.load_tokens == old.load_tokens == 0
    assert fresh.free_blocks > old.free_blocks == 64


def test_dispatched_requests_count_until_the_replica_reports_them() -> None:
    t = LoadTracker()
    t.observe(StepStats(waiting_tokens=10, running_tokens=90, kv_blocks_total=64, kv_blocks_used=4))
    assert (t.load_tokens, t.free_blocks) == (100, 60)
    t.dispatched("a", 30)
    t.dispatched("b", 50)
    assert t.pending_tokens == 80 and t.load_tokens == 180
    t.settle("a")  # its first output came with a report that counts it
    assert t.load_tokens == 150


def test_the_same_report_seen_again_is_not_a_new_one() -> None:
    t = LoadTracker()
    report = StepStats(running_tokens=5)
    t.dispatched("a", 30)
    for _ in range(SETTLE_REPORTS + 2):
        t.observe(report)
    assert t.reports == 1 and t.pending_tokens == 30


def test_unanswered_requests_settle_after_enough_new_reports() -> None:
    t = LoadTracker()
    t.dispatched("waiting", 40)  # queued in the replica: no output for a while
    for i in range(SETTLE_REPORTS - 1):
        t.observe(StepStats(waiting_tokens=40 + i))
        assert t.pending_tokens == 40, "a report may have left before the replica saw it"
    t.observe(StepStats(waiting_tokens=40))
    assert t.pending_tokens == 0 and t.load_tokens == 40


def test_a_burst_between_two_reports_spreads_over_replicas() -> None:
    """Without the account, every request of the burst would go to the replica that was
    idlest at the last report."""
    busy, idle = LoadTracker(), LoadTracker()
    busy.observe(StepStats(running_tokens=300))
    idle.observe(StepStats())
    picks = []
    for i in range(8):
        target = min((busy, idle), key=lambda t: t.load_tokens)
        target.dispatched(f"r{i}", 100)
        picks.append(target is busy)
    assert picks.count(True) == 3 and picks.count(False) == 5
    assert (busy.load_tokens, idle.load_tokens) == (600, 500)


def test_silence_is_measured_from_the_last_new_report() -> None:
    clock = Clock()
    t = LoadTracker(clock=clock)
    clock.now += 5
    assert t.silent_for() == 5
    t.observe(StepStats())
    assert t.silent_for() == 0


def test_sum_stats_adds_counts_and_keeps_the_longest_step() -> None:
    total = sum_stats(
        [
            StepStats(step_duration=0.5, num_running=2, kv_blocks_used=3, kv_blocks_total=10),
            StepStats(step_duration=0.2, num_running=1, kv_blocks_used=1, kv_blocks_total=10),
        ]
    )
    assert total.step_duration == 0.5 and total.num_running == 3
    assert (total.kv_blocks_used, total.kv_blocks_total) == (4, 20)
    assert sum_stats([]) == StepStats()


def test_sum_stats_merges_waiting_work_by_priority() -> None:
    total = sum_stats(
        [
            StepStats(waiting_by_priority=((0, 1, 50), (2, 3, 300))),
            StepStats(waiting_by_priority=((1, 2, 80), (2, 1, 40))),
            StepStats(),  # a replica that does not report it
        ]
    )
    assert total.waiting_by_priority == ((0, 1, 50), (1, 2, 80), (2, 4, 340))
    assert sum_stats([StepStats(), StepStats()]).waiting_by_priority is None


def test_one_replicas_stats_are_its_own_report() -> None:
    # The gateway reads a model's stats on every request: one replica's come back as the same
    # object until it reports again, with nothing summed or compared.
    report = StepStats(num_running=3, waiting_by_priority=((1, 2, 30),))
    assert sum_stats([report]) is report
    assert sum_stats(iter([report, report])).num_running == 6
