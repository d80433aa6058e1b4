"""The gateway's refusals, each a `GatewayError` with the headers a client needs to back off."""

from __future__ import annotations

import math
from collections.abc import Mapping


class GatewayError(Exception):
    """A refusal the HTTP layer turns into a JSON error (401, 429, 503) with headers."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type  # authentication_error | rate_limit_error | overloaded_error
        self.message = message
        self.headers = dict(headers or {})
        self.reason = reason or error_type


def retry_headers(seconds: float) -> dict[str, str]:
    """`Retry-After` in whole seconds (HTTP allows no fraction), at least 1; `retry-after-ms`
    (read by the OpenAI SDKs) with the precise value."""
    seconds = max(0.0, seconds)
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
    }


def unauthenticated(message: str) -> GatewayError:
    return GatewayError(
        401, "authentication_error", message, {"www-authenticate": "Bearer"}, reason="auth"
    )


def rate_limited(
    message: str, retry_after_s: float | None, headers: dict[str, str]
) -> GatewayError:
    if retry_after_s is not None:
        headers = {**headers, **retry_headers(retry_after_s)}
    return GatewayError(429, "rate_limit_error", message, headers, reason="rate_limit")


def overloaded(message: str, retry_after_s: float) -> GatewayError:
    return GatewayError(
        503, "overloaded_error", message, retry_headers(retry_after_s), reason="overloaded"
    )


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: `1m30s`, `2.5s`, `250ms`."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
