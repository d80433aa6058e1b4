"""A launched step's picks (runner/launched.py): read by request, and kept where the next
step's placeholders find them; a placeholder no launched step answers is refused by name."""

from __future__ import annotations

import pytest
import torch
from factories import DEVICES

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.launched import LastTokens, Launched
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.request import PENDING_TOKEN, SamplingParams

P = SamplingParams()


@pytest.mark.parametrize("device", DEVICES)
def test_picks_on_the_device_are_read_by_request(device: str) -> None:
    tokens = torch.tensor([7, 3, 9], device=device)
    launched = Launched.on_device(["a", "b", "c"], tokens)
    assert (launched.host is not None) == (device == "cuda")  # a copy queued, pinned
    result = launched.read()
    assert result.sampled == {"a": 7, "b": 3, "c": 9}
    assert Launched(result=result).read() is result  # picks the host made: as they are


@pytest.mark.parametrize("device", DEVICES)
def test_placeholders_take_the_kept_picks_of_their_requests(device: str) -> None:
    dev = torch.device(device)
    steps = [
        ScheduledRequest("x", [4], 8, [0, 1, 7], True, P, 1),
        ScheduledRequest("b", [PENDING_TOKEN], 5, [2, 3], True, P, 1),
        ScheduledRequest("c", [1, 2, 3], 0, [4], True, P, 0),
        ScheduledRequest("a", [PENDING_TOKEN], 6, [5, 6], True, P, 2),
    ]
    inputs = build_step_inputs(steps, 4, [None], dev)
    assert inputs.pending == [(1, "b"), (2, "a")]  # decodes first: x, b, a, then the chunk
    last = LastTokens()
    assert not last.held
    with pytest.raises(ValueError, match="request b: a pending token no launched step samples"):
        last.fill(inputs.input_ids, inputs.pending)
    last.keep(["a", "z", "b"], torch.tensor([11, 12, 13], device=dev))
    last.fill(inputs.input_ids, inputs.pending)
    assert inputs.input_ids.tolist() == [4, 13, 11, 1, 2, 3]
    last.keep(["z"], torch.tensor([5], device=dev))
    with pytest.raises(ValueError, match="request b: a pending token"):
        last.fill(inputs.input_ids, inputs.pending)
    last.clear()
    assert not last.held and build_step_inputs(steps[:1], 4, [None], dev).pending == []
