"""Per LoRA adapter, for the step stats (vLLM reports the first two as `lora_requests_info`):
(adapter name, requests running, requests waiting, tokens computed since the start), by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from headrace.request import Request, RequestStatus

LoraCounts = tuple[tuple[str, int, int, int], ...]


def lora_counts(
    requests: Iterable[Request], names: Mapping[int, str], tokens: Mapping[int, int]
) -> LoraCounts:
    """Each loaded adapter with a request or a token so far (`names`: adapter id -> name,
    `tokens`: adapter id -> tokens computed)."""
    counts = {i: [0, 0] for i in names if tokens.get(i)}
    for req in requests:
        if req.lora_id in names:
            pair = counts.setdefault(req.lora_id, [0, 0])
            pair[0 if req.status is RequestStatus.RUNNING else 1] += 1
    rows = ((names[i], r, w, tokens.get(i, 0)) for i, (r, w) in counts.items())
    return tuple(sorted(rows))


def add_counts(into: dict[str, tuple[int, int, int]], counts: LoraCounts) -> None:
    """Sum one replica's counts into `into` (the router's total over replicas)."""
    for name, running, waiting, tokens in counts:
        r, w, t = into.get(name, (0, 0, 0))
        into[name] = (r + running, w + waiting, t + tokens)
