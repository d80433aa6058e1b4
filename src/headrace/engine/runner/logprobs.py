"""The logprobs a step's rows ask for: the chosen token's and the N likeliest, from the raw
logits (before any processor, as OpenAI and vLLM report them).

Built on the device as one table for all the rows that ask (`logprob_table`), which reaches
the host in one copy: read at once in a step in series (`read_logprobs`), or queued behind the
step and read when it lands (--async-scheduling, runner/launched.py), so a row with logprobs
no longer keeps a step from overlapping the next.

Shapes: logits [S, V] (any float dtype), picks [S] int64 on the same device -> packed
[W, 1 + 2 N] float64 for the W rows that ask (N their largest count): the chosen token's
logprob, the N best logprobs, their ids (exact in float64).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headrace.engine.messages import TokenLogprobs
from headrace.engine.outputs import ScheduledRequest
from headrace.kernels.host_copy import to_device


@dataclass(frozen=True)
class LogprobTable:
    rows: list[int]  # the rows that asked, in step order
    counts: list[int]  # how many alternatives each asked for
    packed: torch.Tensor  # [W, 1 + 2 N] float64, where the step ran


def logprob_table(
    logits: torch.Tensor, requests: Sequence[ScheduledRequest], picks: torch.Tensor
) -> LogprobTable | None:
    """The table of the rows whose request asks for logprobs (None: no row asks)."""
    wanted = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    if not wanted:
        return None
    rows = to_device(wanted, logits.device, torch.int64)
    lp = torch.log_softmax(logits.index_select(0, rows).float(), dim=-1)  # [W, V]
    counts = [requests[i].params.logprobs or 0 for i in wanted]
    n_max = max(counts)
    values, ids = lp.topk(n_max, dim=-1)  # [W, N] each, largest first
    chosen = lp.gather(1, picks.index_select(0, rows)[:, None])  # [W, 1]
    packed = torch.cat([chosen.double(), values.double(), ids.double()], 1)
    return LogprobTable(wanted, counts, packed)


def read_logprobs(
    table: LogprobTable | None, num_rows: int, chosen: list[int], packed: list[list[float]]
) -> list[TokenLogprobs | None]:
    """Per row of the step, its logprobs (None where it asked for none); `packed`: the
    table's values on the host, `chosen` the step's tokens."""
    out: list[TokenLogprobs | None] = [None] * num_rows
    if table is None:
        return out
    n_max = max(table.counts)
    for i, n, row in zip(table.rows, table.counts, packed, strict=True):
        top = list(zip(map(int, row[1 + n_max : 1 + n_max + n]), row[1 : 1 + n], strict=True))
        out[i] = TokenLogprobs(chosen[i], row[0], top)
    return out
