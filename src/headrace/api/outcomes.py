"""One table: how a request that reached (or tried to reach) an engine ends, as HTTP.

Every route, the replica API and the ledger's record look an outcome up here — a finish
reason the engine reported, an exception its stream raised, the client or the server going
away, an engine not there to serve — so that one outcome has one status, error type and code
wherever it is answered or recorded. The gateway's own refusals (401, 429, 503 before
admission) keep theirs in `gateway/errors.py`; validation (400) in `api/errors.py`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from headrace.api.errors import APIError, bad_request
from headrace.engine.limits import DoesNotFit
from headrace.request import FinishReason

log = logging.getLogger("headrace.api")


@dataclass(frozen=True)
class Answer:
    """The HTTP side of an outcome; `message` is the default text, `{}` for a detail."""

    status: int
    type: str
    code: int | None
    message: str


class Outcome(enum.Enum):
    """Ways a request ends other than with its tokens (200)."""

    # The engine (a replica) failed on this request: the fault is upstream.
    ENGINE_ERROR = Answer(502, "server_error", 502, "the engine failed on this request")
    # Not started within its queue deadline (load shedding after admission).
    OVERLOADED = Answer(
        503, "overloaded_error", 503, "the request did not start within its queue deadline"
    )
    # The engine's stream stopped without a last chunk: a bug, not a load condition.
    NO_RESULT = Answer(500, "server_error", None, "the engine ended the request without a result")
    # The engine itself raised: it cannot serve now.
    ENGINE_FAILED = Answer(503, "unavailable_error", None, "the engine failed: {}")
    CLIENT_GONE = Answer(499, "client_closed", None, "client closed the request")
    SHUTTING_DOWN = Answer(503, "unavailable_error", 503, "server shutting down")
    LOADING = Answer(503, "unavailable_error", 503, "model is loading")
    LOAD_FAILED = Answer(503, "unavailable_error", None, "model failed to load: {}")
    ENGINE_DOWN = Answer(503, "unavailable_error", None, "the engine of model {} is not running")

    def error(self, detail: object = None, message: str | None = None) -> APIError:
        """This outcome as the error a route raises; `message` replaces the default text."""
        a = self.value
        text = message or (a.message.format(detail) if "{}" in a.message else a.message)
        return APIError(a.status, text, type=a.type, code=a.code)


# A run that the engine ended with one of these reasons is answered with that outcome.
_BY_REASON = {FinishReason.ERROR: Outcome.ENGINE_ERROR, FinishReason.OVERLOADED: Outcome.OVERLOADED}
ABORTED = Outcome.CLIENT_GONE.value.status  # what the ledger records for a run cut short


def for_reason(reason: FinishReason | None) -> Outcome | None:
    """The failure a finish reason stands for; None for a result (stop, length, ...)."""
    return _BY_REASON.get(reason) if reason is not None else None


def raise_for(reason: FinishReason | None, error: str | None) -> None:
    """Raise the route's error for a chunk that ended so (the engine's text, if it said one)."""
    outcome = for_reason(reason)
    if outcome is not None:
        raise outcome.error(message=error)


def engine_failure(e: Exception, request_id: str) -> APIError:
    """What an engine's stream raised, as the HTTP error: refused before it started (a
    ValueError: it can never fit) 400, ended without a result 500, the engine failed 503."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ValueError):
        return bad_request(str(e), e.param if isinstance(e, DoesNotFit) else None)
    if isinstance(e, StopAsyncIteration):
        return Outcome.NO_RESULT.error()
    log.error("engine failed on %s", request_id, exc_info=e)
    return Outcome.ENGINE_FAILED.error(e)


def status_of(reason: FinishReason | None, raised: int | None) -> int | None:
    """The status a run that ended so was answered with: what it raised, else its reason's
    failure; None when it ended with a result or not at all."""
    if raised is not None:
        return raised
    outcome = for_reason(reason)
    return outcome.value.status if outcome is not None else None
