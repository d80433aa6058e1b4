"""The runner's checks of a step (runner/step_checks.py): a step out of bounds is refused with
the request at fault named, whichever pass catches it; a decode's block for its token is
checked every step, the rest of its table where the kept rows write it."""

from __future__ import annotations

import pytest

from headrace.engine.outputs import ScheduledRequest, SchedulerOutput
from headrace.engine.runner.step_checks import check_step
from headrace.request import PENDING_TOKEN, SamplingParams

BS, POOL, CONTEXT, VOCAB = 4, 10, 64, 100
P = SamplingParams()


def _check(*reqs: ScheduledRequest, kept_rows: bool = True) -> None:
    check_step(SchedulerOutput(list(reqs)), CONTEXT, VOCAB, POOL, BS, kept_rows)


def _decode(rid: str, pos: int, blocks: list[int], token: int = 5) -> ScheduledRequest:
    return ScheduledRequest(rid, [token], pos, blocks, True, P, 1, table_epoch=1)


def test_a_step_within_bounds_passes() -> None:
    _check(_decode("a", 5, [1, 2]), ScheduledRequest("c", [1, 2, 3], 0, [3], True, P, 0))
    _check(kept_rows=False)  # an empty step


def test_the_block_a_decode_writes_is_checked_every_step() -> None:
    # position 5 writes into its table's second block: out of the pool, with no new epoch
    with pytest.raises(ValueError, match="request b: block id outside the KV pool"):
        _check(_decode("a", 5, [1, 2]), _decode("b", 5, [3, POOL]))
    # an earlier block of a decode's table is the kept rows' to check, when they write it
    _check(_decode("b", 5, [POOL, 3]))
    with pytest.raises(ValueError, match="request b: block id outside"):
        _check(_decode("b", 5, [POOL, 3]), kept_rows=False)  # no kept rows: the whole table


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (_decode("t", 5, [1, 2], token=VOCAB), "request t: token id outside"),
        (_decode("p", CONTEXT, [1] * 17), "request p: position 64 is past max_model_len 64"),
        (ScheduledRequest("c", [1, 2], 0, [-1], True, P, 0), "request c: block id outside"),
    ],
    ids=["token", "position", "chunk-block"],
)
def test_the_request_at_fault_is_named(req: ScheduledRequest, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _check(_decode("ok", 1, [0]), req)


def test_a_short_table_is_left_to_the_layout_which_names_it() -> None:
    _check(_decode("short", 9, [1]))  # step_inputs refuses it: "1 blocks cannot hold 10 tokens"


def test_a_placeholder_passes_only_as_a_decodes_token_where_a_step_kept_its_picks() -> None:
    pending = _decode("p", 5, [1, 2], token=PENDING_TOKEN)
    out = SchedulerOutput([_decode("a", 5, [1, 2]), pending])
    check_step(out, CONTEXT, VOCAB, POOL, BS, True, pending_ok=True)
    with pytest.raises(ValueError, match="request p: token id outside"):
        check_step(out, CONTEXT, VOCAB, POOL, BS, True)  # no step before kept its picks
    chunk = ScheduledRequest("c", [3, PENDING_TOKEN], 0, [3], True, P, 0)
    with pytest.raises(ValueError, match="request c: token id outside"):
        check_step(SchedulerOutput([pending, chunk]), CONTEXT, VOCAB, POOL, BS, True, True)
    below = _decode("b", 5, [1, 2], token=PENDING_TOKEN - 1)
    with pytest.raises(ValueError, match="request b: token id outside"):
        check_step(SchedulerOutput([below]), CONTEXT, VOCAB, POOL, BS, True, True)
