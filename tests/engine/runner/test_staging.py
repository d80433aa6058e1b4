"""A step's integer inputs in one buffer: values, shapes, alignment, one storage."""

from __future__ import annotations

import pytest
import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.staging import Staging
from headrace.engine.runner.step_inputs import build_step_inputs
from headrace.request import SamplingParams


def test_parts_come_back_in_order_as_views_of_one_aligned_buffer() -> None:
    staging = Staging()
    parts = [[5, 6, 7], [], [1, 2, 3, 4, 5, 6], [9]]
    shapes = [(3,), (0,), (2, 3), (1, 1)]
    for values, shape in zip(parts, shapes, strict=True):
        staging.add(values, shape)
    got = staging.send(torch.device("cpu"))
    for tensor, values, shape in zip(got, parts, shapes, strict=True):
        assert tensor.dtype == torch.int64 and tensor.shape == shape
        assert tensor.flatten().tolist() == values
        assert tensor.is_contiguous()
        assert tensor.data_ptr() % 16 == 0  # each part starts 16-byte aligned
    assert len({t.untyped_storage().data_ptr() for t in got}) == 1


def test_a_part_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="5 values for shape"):
        Staging().add(range(5), (2, 3))


def test_step_tensors_share_one_buffer_and_every_window_one_table() -> None:
    step = [
        ScheduledRequest(
            str(i), [7], pos, list(range(10 * i, 10 * i + 9)), True, SamplingParams(), 1
        )  # fmt: skip
        for i, pos in enumerate([3, 40, 130])
    ]
    step.append(ScheduledRequest("p", [1, 2, 3], 0, [99], True, SamplingParams(), 0))
    inputs = build_step_inputs(step, 16, [32, None], torch.device("cpu"), paged_kernel=True)
    views = inputs.meta.decode_views
    assert views[32].block_table is views[None].block_table
    table = views[None].block_table
    assert table.tolist() == [  # each row from its first block; padded with block 0
        [0] * 9,
        [10, 11, 12] + [0] * 6,
        [20, 21, 22, 23, 24, 25, 26, 27, 28],
    ]
    bounds_none, bounds_32 = views[None].bounds, views[32].bounds
    assert bounds_none is not None and bounds_32 is not None
    assert bounds_none.tolist() == [[0, 0, 0], [0, 0, 0], [4, 41, 131]]
    assert bounds_32.tolist() == [[0, 0, 0], [0, 9, 99], [4, 41, 131]]
    assert inputs.input_ids.tolist() == [7, 7, 7, 1, 2, 3]
    assert inputs.positions.tolist() == [3, 40, 130, 0, 1, 2]
    assert inputs.sample_rows.tolist() == [0, 1, 2, 5]
    storages = {
        t.untyped_storage().data_ptr()
        for t in (inputs.input_ids, inputs.positions, inputs.sample_rows, table, bounds_32,
                  inputs.meta.slot_mapping)
    }  # fmt: skip
    assert len(storages) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_parts_arrive_on_the_device() -> None:
    staging = Staging()
    staging.add(range(6), (2, 3))
    staging.add([8], (1,))
    table, last = staging.send(torch.device("cuda"))
    assert table.is_cuda and last.is_cuda
    assert table.cpu().tolist() == [[0, 1, 2], [3, 4, 5]] and last.item() == 8


def test_a_decode_whose_table_cannot_hold_its_position_is_refused_by_name() -> None:
    ok = ScheduledRequest("ok", [7], 3, [0], True, SamplingParams(), 1)
    short = ScheduledRequest("short", [7], 16, [0], True, SamplingParams(), 1)  # needs 2 blocks
    with pytest.raises(ValueError, match="request short: 1 blocks cannot hold 17 tokens"):
        build_step_inputs([ok, short], 16, [None], torch.device("cpu"), paged_kernel=True)


def test_decode_rows_keep_their_order_samples_and_adapters() -> None:
    step = [
        ScheduledRequest("a", [4], 5, [2], True, SamplingParams(), 1, lora_id=3),
        ScheduledRequest("p", [1, 2], 0, [9], False, SamplingParams(), 0),  # a chunk, after
        ScheduledRequest("b", [6], 17, [4, 5], False, SamplingParams(), 1),  # a prompt's last
        ScheduledRequest("c", [8], 0, [7], True, SamplingParams(), 0, lora_id=3),
    ]
    inputs = build_step_inputs(step, 16, [None], torch.device("cpu"), paged_kernel=True)
    assert inputs.input_ids.tolist() == [4, 6, 8, 1, 2]
    assert inputs.positions.tolist() == [5, 17, 0, 0, 1]
    assert inputs.meta.slot_mapping.tolist() == [2 * 16 + 5, 5 * 16 + 1, 7 * 16, 9 * 16, 9 * 16 + 1]
    assert inputs.sample_rows.tolist() == [0, 2]
    assert [s.request_id for s in inputs.sampled] == ["a", "c"]
    assert inputs.lora_segments == [(3, 0, 1), (3, 2, 3)]


def test_per_token_attention_never_splits_a_sequence_on_the_gpu() -> None:
    """--deterministic: a token's attention must not depend on its batch, and the GPU decode
    kernel's spans would depend on the batch's size."""
    step = [ScheduledRequest("a", [1, 2, 3], 4, [0, 1], True, SamplingParams(), 0)]
    for per_token, splits in ((True, 1), (False, None)):
        inputs = build_step_inputs(
            step + [ScheduledRequest("d", [7], 3, [2], True, SamplingParams(), 1)],
            16, [None], torch.device("cpu"), paged_kernel=True, per_token=per_token,
        )  # fmt: skip
        assert inputs.meta.decode_views[None].splits == splits
