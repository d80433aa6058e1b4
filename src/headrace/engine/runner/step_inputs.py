"""Turn a `SchedulerOutput` into the tensors of one forward pass.

Rows of the flattened batch: first every single-token request (decodes, batched together in
attention), then each multi-token chunk. Everything per step — slots, block tables, masks — is
computed here once and shared by all layers; its integers reach the device in one copy
(staging.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import torch

from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.block_rows import BlockRows
from headrace.engine.runner.staging import Staging
from headrace.kernels.host_copy import to_device
from headrace.layers.attention import AttentionMetadata, KVView, PrefillChunk, Window
from headrace.request import PENDING_TOKEN


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] int64: row of each sampled request's last token
    sampled: list[ScheduledRequest]  # the requests behind sample_rows, same order
    # [D] int64: rows of the draft tokens, request after request in the order of `sampled`
    draft_rows: torch.Tensor | None = None
    # (adapter id, first row, end row) of every request of a LoRA adapter (base rows omitted)
    lora_segments: list[tuple[int, int, int]] = field(default_factory=list)
    # (row, request id) of each decode whose token the step before samples (PENDING_TOKEN in
    # input_ids until the runner fills it on the device: --async-scheduling)
    pending: list[tuple[int, str]] = field(default_factory=list)


def build_step_inputs(
    scheduled: Sequence[ScheduledRequest],
    block_size: int,
    windows: Sequence[Window],
    device: torch.device,
    mask_dtype: torch.dtype | None = None,
    paged_kernel: bool = False,
    per_token: bool = False,
    block_rows: BlockRows | None = None,
    paged_prefill: bool = False,
) -> StepInputs:
    """`mask_dtype`: decode masks as additive float masks of the queries' dtype, converted once
    here rather than by every layer's attention call (None: boolean masks). `paged_kernel`:
    decodes get the bounds of the in-place kernel instead of masks. `per_token` (with
    `paged_kernel`): every token attends as a decode of its own, over the cache up to itself,
    so its attention is the same however its sequence was chunked, cached or drafted.
    `block_rows`: the runner's decode table rows, kept between steps (None: built afresh).
    `paged_prefill`: a chunk over cached blocks reads them in place (a table, no mask)."""
    decodes = [s for s in scheduled if len(s.token_ids) == 1]
    chunks = [s for s in scheduled if len(s.token_ids) > 1]
    ordered, num_decodes = decodes + chunks, len(decodes)
    tokenwise = per_token and paged_kernel
    if tokenwise:
        decodes = [_token_of(s, i) for s in ordered for i in range(len(s.token_ids))]
    in_place = paged_prefill and not tokenwise
    rows = _lay_out(ordered, num_decodes, block_size, windows, device, tokenwise, in_place)
    staging = Staging()
    for part in (rows.slots, rows.ids, rows.positions, rows.sample_rows, rows.draft_rows):
        staging.add(part, (len(part),))
    if decodes and paged_kernel:
        _stage_paged(
            decodes, block_size, windows, staging, BlockRows() if block_rows is None else block_rows
        )
    slots, ids, positions, sample_rows, draft_rows, *paged = staging.send(device)
    if not decodes:
        decode_views: dict[Window, KVView] = {}
    elif paged_kernel:
        table, *bounds = paged
        splits = 1 if tokenwise else None  # per-token attention: the same in any batch
        decode_views = {
            w: KVView(table, None, b, splits) for w, b in zip(windows, bounds, strict=True)
        }
    else:
        decode_views = _masked_views(decodes, block_size, windows, device, mask_dtype)
    meta = AttentionMetadata(slots, len(decodes), decode_views, rows.prefills)
    return StepInputs(
        ids,
        positions,
        meta,
        sample_rows,
        rows.sampled,
        draft_rows if rows.draft_rows else None,
        rows.lora_segments,
        _pending(rows.ids, ordered),
    )


def _pending(ids: list[int], ordered: list[ScheduledRequest]) -> list[tuple[int, str]]:
    """The placeholders' rows (only a decode has one: step_checks.py); one C pass when there
    are none."""
    if not ids or min(ids) != PENDING_TOKEN:
        return []
    return [(i, ordered[i].request_id) for i, t in enumerate(ids) if t == PENDING_TOKEN]


class _Rows(NamedTuple):
    """The step's rows as lists, before they become tensors (fields as in `StepInputs`)."""

    ids: list[int]
    positions: list[int]
    slots: list[int]
    sample_rows: list[int]
    draft_rows: list[int]
    sampled: list[ScheduledRequest]
    prefills: list[PrefillChunk]
    lora_segments: list[tuple[int, int, int]]


def _lay_out(
    ordered: list[ScheduledRequest],
    num_decodes: int,
    block_size: int,
    windows: Sequence[Window],
    device: torch.device,
    tokenwise: bool,
    in_place: bool = False,
) -> _Rows:
    """The step's rows: its decodes (the first `num_decodes` of `ordered`, a token each) a
    field at a time, then the chunks request after request, inline: it runs every step."""
    rows = _lay_out_decodes(ordered[:num_decodes], block_size)
    ids, positions, slots, sample_rows, draft_rows, sampled, prefills, lora_segments = rows
    for req in ordered[num_decodes:]:
        start = len(ids)
        n = len(req.token_ids)
        _check_blocks(req, block_size)
        ids.extend(req.token_ids)
        if req.lora_id:
            lora_segments.append((req.lora_id, start, start + n))
        for pos in range(req.start_pos, req.start_pos + n):
            positions.append(pos)
            slots.append(req.block_ids[pos // block_size] * block_size + pos % block_size)
        if n > 1 and not tokenwise:
            views = _prefill_views(req, block_size, windows, device, in_place)
            prefills.append(PrefillChunk(start, start + n, views, req.start_pos))
        if req.sample:
            last = start + n - 1 - len(req.draft_token_ids)  # the last known token's row
            sample_rows.append(last)
            draft_rows.extend(range(last + 1, start + n))
            sampled.append(req)
    return rows


def _lay_out_decodes(decodes: list[ScheduledRequest], block_size: int) -> _Rows:
    """One-token shares in list comprehensions: at 256 decodes the loop above took twice as
    long (it appends to seven lists a request)."""
    ids = [d.token_ids[0] for d in decodes]
    positions = [d.start_pos for d in decodes]
    try:
        slots = [
            d.block_ids[p // block_size] * block_size + p % block_size
            for d, p in zip(decodes, positions, strict=True)
        ]
    except IndexError:  # a table too short for its position: say whose
        for d in decodes:
            _check_blocks(d, block_size)
        raise
    sample_rows = [i for i, d in enumerate(decodes) if d.sample]
    sampled = [decodes[i] for i in sample_rows]
    loras = [(d.lora_id, i, i + 1) for i, d in enumerate(decodes) if d.lora_id]
    return _Rows(ids, positions, slots, sample_rows, [], sampled, [], loras)


def _token_of(req: ScheduledRequest, i: int) -> ScheduledRequest:
    """Token `i` of a request's share as a one-token share (what the decode views read)."""
    return msgspec.structs.replace(
        req, token_ids=req.token_ids[i : i + 1], start_pos=req.start_pos + i
    )


def _check_blocks(req: ScheduledRequest, block_size: int) -> None:
    end = req.start_pos + len(req.token_ids)
    if len(req.block_ids) * block_size < end:
        raise ValueError(
            f"request {req.request_id}: {len(req.block_ids)} blocks cannot hold {end} tokens"
        )


def _first_block(first_query_pos: int, block_size: int, window: Window) -> int:
    """The first block any query of a sequence can see under `window`."""
    if window is None:
        return 0
    return max(0, first_query_pos - window + 1) // block_size


def _stage_paged(
    decodes: list[ScheduledRequest],
    block_size: int,
    windows: Sequence[Window],
    staging: Staging,
    block_rows: BlockRows,
) -> None:
    """The in-place kernel's inputs: one block table [B, nb] from each sequence's first block,
    which every window reads (nb: the longest context's blocks, rows padded with block 0),
    then per window the bounds [3, B] (base 0; first and one-past-last visible position)."""
    # Lists, not numpy, for all but the table: at one decode numpy's fixed costs were 15 us
    his = [d.start_pos + 1 for d in decodes]
    staging.add_array(block_rows.gather(decodes, his, block_size))
    base = [0] * len(decodes)
    for window in windows:
        los = base if window is None else [max(0, h - window) for h in his]
        staging.add(base + los + his, (3, len(decodes)))


def _masked_views(
    decodes: list[ScheduledRequest],
    block_size: int,
    windows: Sequence[Window],
    device: torch.device,
    mask_dtype: torch.dtype | None,
) -> dict[Window, KVView]:
    """Where there is no in-place kernel, for each window: padded block tables [B, nb] and
    masks [B, 1, 1, nb * bs] for SDPA over the gathered blocks."""
    last = torch.tensor([d.start_pos for d in decodes], dtype=torch.int64)  # query positions
    views: dict[Window, KVView] = {}
    for window in windows:
        firsts = [_first_block(d.start_pos, block_size, window) for d in decodes]
        rows = [
            d.block_ids[f : d.start_pos // block_size + 1]
            for d, f in zip(decodes, firsts, strict=True)
        ]
        width = max(len(r) for r in rows)
        table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int64)
        offsets = torch.arange(width * block_size, dtype=torch.int64)
        pos = torch.tensor(firsts, dtype=torch.int64)[:, None] * block_size + offsets  # [B, L]
        mask = pos <= last[:, None]
        if window is not None:
            mask &= pos > last[:, None] - window
        mask = mask[:, None, None, :]  # [B, 1, 1, L]
        if mask_dtype is not None:
            mask = torch.zeros(mask.shape, dtype=mask_dtype).masked_fill(~mask, float("-inf"))
        views[window] = KVView(to_device(table, device), to_device(mask, device))
    return views


def _prefill_views(
    req: ScheduledRequest,
    block_size: int,
    windows: Sequence[Window],
    device: torch.device,
    in_place: bool,
) -> dict[Window, KVView]:
    """A chunk's cache view for each window where causal attention over the chunk itself does
    not suffice. `in_place`: one view for all of them, the sequence's blocks from its first,
    for the kernel (which applies each window itself)."""
    s, n = req.start_pos, len(req.token_ids)
    needed = [w for w in windows if s > 0 or (w is not None and n > w)]
    if not needed or not in_place:
        return {w: _gathered_view(req, block_size, w, device) for w in needed}
    blocks = req.block_ids[: (s + n - 1) // block_size + 1]
    return dict.fromkeys(needed, KVView(to_device(blocks, device, torch.int64), None))


def _gathered_view(
    req: ScheduledRequest, block_size: int, window: Window, device: torch.device
) -> KVView:
    """The blocks `window` lets the chunk see, gathered, and the [n, L] mask over them."""
    s, n = req.start_pos, len(req.token_ids)
    first = _first_block(s, block_size, window)
    last_block = (s + n - 1) // block_size
    table = torch.tensor(req.block_ids[first : last_block + 1], dtype=torch.int64)
    kv_pos = first * block_size + torch.arange(len(table) * block_size)  # [L]
    q_pos = torch.arange(s, s + n)[:, None]  # [n, 1]
    mask = kv_pos[None, :] <= q_pos
    if window is not None:
        mask &= kv_pos[None, :] > q_pos - window
    return KVView(to_device(table, device), to_device(mask, device))
