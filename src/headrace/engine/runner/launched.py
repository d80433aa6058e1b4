"""A step launched and not yet read (--async-scheduling, engine/core/overlap.py).

Its sampled ids stay on the device, where the next step's placeholders are filled from them
(`LastTokens`), and reach the host in one copy queued behind the step (pinned memory and an
event on CUDA), so reading them never holds up the launch of the step after; so does the
table of the logprobs its rows asked for (runner/logprobs.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headrace.engine.outputs import RunnerOutput
from headrace.engine.runner.logprobs import LogprobTable, read_logprobs
from headrace.kernels.host_copy import to_device


@dataclass
class Launched:
    """`result` where the host made the picks (lists already), else the picks on the device."""

    result: RunnerOutput | None = None
    ids: Sequence[str] = ()  # the sampled requests, in row order
    tokens: torch.Tensor | None = None  # [S] int64, where the step ran
    logprobs: LogprobTable | None = None  # the rows' that ask, where the step ran
    host: tuple[torch.Tensor, torch.Tensor | None] | None = None  # their copies on the way
    ready: torch.cuda.Event | None = None

    @classmethod
    def on_device(
        cls, ids: Sequence[str], tokens: torch.Tensor, logprobs: LogprobTable | None = None
    ) -> Launched:
        if tokens.device.type != "cuda":
            return cls(ids=ids, tokens=tokens, logprobs=logprobs)
        table = None if logprobs is None else _pinned_copy(logprobs.packed)
        host = (_pinned_copy(tokens), table)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
        return cls(ids=ids, tokens=tokens, logprobs=logprobs, host=host, ready=ready)

    def read(self) -> RunnerOutput:
        """The step's tokens by request (waits for the device where it still runs)."""
        if self.result is not None:
            return self.result
        assert self.tokens is not None
        tokens, table = self.tokens, None if self.logprobs is None else self.logprobs.packed
        if self.ready is not None and self.host is not None:
            self.ready.synchronize()
            tokens, table = self.host
        values = tokens.tolist()
        packed = table.tolist() if table is not None else []
        rows = read_logprobs(self.logprobs, len(values), values, packed)
        logprobs = {rid: lp for rid, lp in zip(self.ids, rows, strict=True) if lp is not None}
        return RunnerOutput(dict(zip(self.ids, values, strict=True)), logprobs)


def _pinned_copy(x: torch.Tensor) -> torch.Tensor:
    """`x` on its way to pinned host memory, queued behind the step (read after its event)."""
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    return host


class LastTokens:
    """The last launched step's sampled ids, where the step after it finds its placeholders'
    tokens (kept only for a step that overlaps the next: `keep`)."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}  # request id -> its row in `tokens`
        self.tokens: torch.Tensor | None = None  # [S] int64 on the device

    @property
    def held(self) -> bool:
        return self.tokens is not None

    def keep(self, ids: Sequence[str], tokens: torch.Tensor) -> None:
        self.rows = {rid: i for i, rid in enumerate(ids)}
        self.tokens = tokens

    def clear(self) -> None:
        self.rows, self.tokens = {}, None

    def tokens_of(self, ids: Sequence[str | None]) -> torch.Tensor:
        """[len(ids)] on the device: each named request's token in the last launched step
        (for None, any one of them: it is not read), for a history that ends in its
        placeholder (penalties, bad words)."""
        missing = [rid for rid in ids if rid is not None and rid not in self.rows]
        if self.tokens is None or missing:
            name = missing[0] if missing else next(filter(None, ids), None)
            raise ValueError(f"request {name}: a pending token no launched step samples")
        src = [self.rows[rid] if rid is not None else 0 for rid in ids]
        return self.tokens.index_select(0, to_device(src, self.tokens.device, torch.int64))

    def fill(self, input_ids: torch.Tensor, pending: Sequence[tuple[int, str]]) -> None:
        """Write into `input_ids` [T] each placeholder's token: (row, request id) pairs."""
        if not pending:
            return
        tokens = self.tokens
        missing = [rid for _, rid in pending if rid not in self.rows]
        if tokens is None or missing:
            name = missing[0] if missing else pending[0][1]
            raise ValueError(f"request {name}: a pending token no launched step samples")
        device = input_ids.device
        at = to_device([row for row, _ in pending], device, torch.int64)
        src = to_device([self.rows[rid] for _, rid in pending], device, torch.int64)
        input_ids[at] = tokens[src]
