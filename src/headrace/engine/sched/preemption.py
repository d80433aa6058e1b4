"""Whom a more urgent waiting request may preempt (recompute later) to be admitted now."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from headrace.config import SchedulerConfig
from headrace.engine.kv.block_manager import BlockManager
from headrace.request import Request


def priority_victims(
    running: Sequence[Request],
    req: Request,
    need_blocks: int,
    free_blocks: int,
    blocks_of: Callable[[Request], int],
    max_num_seqs: int,
    max_preemptions: int,
) -> list[Request] | None:
    """The fewest lowest-ranked running requests of a lower tier whose room admits `req`.

    `running` is in rank order (priority, then arrival), so victims come from its end: the
    lowest priority, latest arrival first. A request already preempted `max_preemptions`
    times is spared, so that a stream of urgent arrivals cannot thrash it. None when even
    every eligible victim would not make room (then nobody is preempted).
    """
    chosen: list[Request] = []
    for victim in reversed(running):
        if len(running) - len(chosen) < max_num_seqs and need_blocks <= free_blocks:
            break
        if victim.priority <= req.priority or victim.num_preemptions >= max_preemptions:
            continue
        chosen.append(victim)
        free_blocks += blocks_of(victim)
    if len(running) - len(chosen) >= max_num_seqs or need_blocks > free_blocks:
        return None
    return chosen


def victims_to_admit(
    running: Sequence[Request],
    req: Request,
    n: int,
    blocks: BlockManager,
    config: SchedulerConfig,
) -> list[Request] | None:
    """`priority_victims` for admitting `req` with its next `n` tokens into `blocks`."""
    return priority_victims(
        running,
        req,
        need_blocks=blocks.blocks_needed(req.request_id, req.num_computed_tokens + n),
        free_blocks=blocks.num_free_blocks,
        blocks_of=lambda r: blocks.num_freeable(r.request_id),
        max_num_seqs=config.seqs_limit,
        max_preemptions=config.max_preemptions,
    )
