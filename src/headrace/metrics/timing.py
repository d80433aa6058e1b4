"""Per-request timing as the front end sees it: arrival, queue, first token, each later token."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestTimer:
    """Timestamps of one request, fed with each chunk the engine streams back.

    `token_gaps` holds one inter-token latency per token after the first; a chunk carrying k
    tokens (the detokenizer may hold text back) spreads its gap evenly over them.
    """

    start: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    end: float | None = None
    queue_time: float | None = None  # seconds, as the engine measured it
    token_gaps: list[float] = field(default_factory=list)

    def on_tokens(
        self, num_tokens: int, queue_time: float | None = None, now: float | None = None
    ) -> None:
        if queue_time is not None and self.queue_time is None:
            self.queue_time = queue_time
        if num_tokens <= 0:
            return
        now = time.monotonic() if now is None else now
        if self.first_token is None:
            self.first_token = now
            num_tokens -= 1
        elif self.last_token is not None:
            gap = (now - self.last_token) / num_tokens
            self.token_gaps.extend([gap] * num_tokens)
            num_tokens = 0
        if num_tokens > 0:  # the first chunk brought several tokens at once
            self.token_gaps.extend([0.0] * num_tokens)
        self.last_token = now

    def finish(self, now: float | None = None) -> None:
        if self.end is None:
            self.end = time.monotonic() if now is None else now

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float:
        return (self.end if self.end is not None else time.monotonic()) - self.start

    def as_ms(self) -> dict[str, float | None]:
        """The `timing` object of a /v1/generate answer."""
        return {
            "queue_ms": _ms(self.queue_time),
            "ttft_ms": _ms(self.ttft),
            "total_ms": round(self.e2e * 1000, 3),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
