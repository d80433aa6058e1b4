"""What the runner refuses in a step before it touches the model or the KV pool: a position
past the context, a token id outside the vocabulary, a block id outside the pool. The
scheduler never sends such a step; the checks keep a bug there from writing into another
request's KV blocks or indexing past the embedding."""

from __future__ import annotations

import operator
from itertools import chain, repeat
from operator import attrgetter

from headrace.engine.outputs import ScheduledRequest, SchedulerOutput
from headrace.request import PENDING_TOKEN

_START, _IDS, _BLOCKS = attrgetter("start_pos"), attrgetter("token_ids"), attrgetter("block_ids")


def check_step(
    out: SchedulerOutput,
    max_model_len: int,
    vocab_size: int,
    num_kv_blocks: int,
    block_size: int,
    decode_blocks_checked: bool,
    pending_ok: bool = False,
) -> None:
    """ValueError naming the first request out of bounds. `decode_blocks_checked`: a decode's
    table is checked where it is written (runner/block_rows.py), once, not every step; here
    only the block its token's K/V go to, every step. `pending_ok`: a decode's token may be
    PENDING_TOKEN (the runner fills it from the step before, or refuses it by name).

    The whole step is checked in a few passes in C (map, chain, min, max: no Python call a
    request, which at 256 decodes cost 0.1 ms a step); a step that fails them is walked
    request by request to name the one at fault."""
    reqs = out.scheduled
    if not reqs:
        return
    lens = list(map(len, map(_IDS, reqs)))
    last = max(map(operator.add, map(_START, reqs), lens))
    ids = list(chain.from_iterable(map(_IDS, reqs)))
    if decode_blocks_checked and min(lens) == max(lens) == 1:  # decodes only: most steps
        blocks = _written_blocks(reqs, block_size)
    elif decode_blocks_checked:
        chunks = [r for r in reqs if len(r.token_ids) > 1]
        blocks = list(chain.from_iterable(map(_BLOCKS, chunks)))
        blocks += _written_blocks([r for r in reqs if len(r.token_ids) == 1], block_size)
    else:
        blocks = list(chain.from_iterable(map(_BLOCKS, reqs)))
    lo = PENDING_TOKEN if pending_ok else 0
    least = min(ids, default=0)
    if (
        last > max_model_len
        or not lo <= least
        or max(ids, default=0) >= vocab_size
        or (blocks and not 0 <= min(blocks) <= max(blocks) < num_kv_blocks)
        or (least < 0 and _pending_in_chunk(reqs))
    ):
        for req in reqs:
            whole = not decode_blocks_checked or len(req.token_ids) > 1
            _check_one(req, max_model_len, vocab_size, num_kv_blocks, block_size, whole, lo)
        raise ValueError("a step out of bounds")  # not reached: one request above is


def _pending_in_chunk(reqs: list[ScheduledRequest]) -> bool:
    """A negative id past a decode's one token (a placeholder stands for no other)."""
    return any(min(r.token_ids) < 0 for r in reqs if len(r.token_ids) > 1)


def _written_blocks(decodes: list[ScheduledRequest], block_size: int) -> list[int]:
    """The block each decode's token goes to (a table too short is left to step_inputs,
    which refuses it by name)."""
    at = map(operator.floordiv, map(_START, decodes), repeat(block_size))
    try:
        return list(map(operator.getitem, map(_BLOCKS, decodes), at))
    except IndexError:
        return []


def _check_one(
    req: ScheduledRequest,
    max_model_len: int,
    vocab_size: int,
    num_kv_blocks: int,
    block_size: int,
    whole: bool,
    lo: int = 0,
) -> None:
    ids = req.token_ids
    lo = lo if len(ids) == 1 else 0  # a placeholder stands only for a decode's one token
    if req.start_pos + len(ids) > max_model_len:
        raise ValueError(
            f"request {req.request_id}: position {req.start_pos + len(ids) - 1}"
            f" is past max_model_len {max_model_len}"
        )
    if ids and not lo <= min(ids) <= max(ids) < vocab_size:
        raise ValueError(f"request {req.request_id}: token id outside [0, {vocab_size})")
    at = req.start_pos // block_size
    blocks = req.block_ids if whole else req.block_ids[at : at + 1]
    if blocks and not 0 <= min(blocks) <= max(blocks) < num_kv_blocks:
        raise ValueError(f"request {req.request_id}: block id outside the KV pool")
