"""The gauges a scheduler reports after each step (metrics, router load, gateway estimates)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.messages import StepStats
from headrace.engine.sched.waiting_queue import WaitingQueue, waiting_by_priority
from headrace.request import Request


def collect_stats(
    running: Sequence[Request],
    queue: WaitingQueue,
    blocks: BlockManager,
    num_preemptions_total: int,
    num_batched_tokens: int,
    num_prefill_tokens: int,
    step_duration: float,
    num_tokens_total: int = 0,
    prefix_cache: tuple[int, int] = (0, 0),
    speculation: tuple[int, int] = (0, 0),
) -> StepStats:
    """`prefix_cache`: prompt tokens looked up in the prefix cache so far, and found;
    `speculation`: draft tokens checked so far, and accepted."""
    return StepStats(
        step_duration=step_duration,
        num_running=len(running),
        num_waiting=len(queue),
        num_batched_tokens=num_batched_tokens,
        num_prefill_tokens=num_prefill_tokens,
        num_decode_tokens=num_batched_tokens - num_prefill_tokens,
        kv_blocks_used=blocks.num_used_blocks,
        kv_blocks_total=blocks.num_blocks,
        num_preemptions_total=num_preemptions_total,
        waiting_tokens=_tokens_to_compute(queue),
        running_tokens=_running_tokens(running),
        waiting_by_priority=waiting_by_priority(queue),
        num_tokens_total=num_tokens_total,
        kv_blocks_cached=blocks.num_cached_blocks,
        prefix_cache_queries_total=prefix_cache[0],
        prefix_cache_hits_total=prefix_cache[1],
        spec_draft_tokens_total=speculation[0],
        spec_accepted_tokens_total=speculation[1],
    )


def _tokens_to_compute(reqs: Iterable[Request]) -> int:
    return sum(r.num_tokens - r.num_computed_tokens for r in reqs)


def _running_tokens(running: Sequence[Request]) -> int:
    """Tokens the running requests have yet to compute, their outputs to come included:
    (prompt + output - computed) + (max_tokens - output), summed in one pass (every step)."""
    return sum(
        len(r.prompt_token_ids) - r.num_computed_tokens + r.params.max_tokens for r in running
    )
