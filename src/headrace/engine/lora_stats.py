"""Requests running and waiting per LoRA adapter, for the step stats (vLLM reports the same
as `lora_requests_info`): (adapter name, running, waiting), by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from headrace.request import Request, RequestStatus

LoraCounts = tuple[tuple[str, int, int], ...]


def lora_counts(requests: Iterable[Request], names: Mapping[int, str]) -> LoraCounts:
    """Each loaded adapter with a request, by name (`names`: adapter id -> name)."""
    counts: dict[str, list[int]] = {}
    for req in requests:
        name = names.get(req.lora_id) if req.lora_id else None
        if name is not None:
            pair = counts.setdefault(name, [0, 0])
            pair[0 if req.status is RequestStatus.RUNNING else 1] += 1
    return tuple((name, running, waiting) for name, (running, waiting) in sorted(counts.items()))


def add_counts(into: dict[str, tuple[int, int]], counts: LoraCounts) -> None:
    """Sum one replica's counts into `into` (the router's total over replicas)."""
    for name, running, waiting in counts:
        r, w = into.get(name, (0, 0))
        into[name] = (r + running, w + waiting)
