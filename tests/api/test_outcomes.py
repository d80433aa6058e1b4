"""The outcome table: one status, type and code per way a request ends, wherever it is used."""

from __future__ import annotations

import pytest

from headrace.api.errors import APIError
from headrace.api.outcomes import Outcome, engine_failure, for_reason, raise_for, status_of
from headrace.engine.limits import DoesNotFit
from headrace.request import FinishReason


@pytest.mark.parametrize(
    ("reason", "status", "type_"),
    [(FinishReason.ERROR, 502, "server_error"), (FinishReason.OVERLOADED, 503, "overloaded_error")],
)
def test_a_failed_finish_raises_its_row(reason: FinishReason, status: int, type_: str) -> None:
    with pytest.raises(APIError) as e:
        raise_for(reason, "the replica went away")
    assert (e.value.status, e.value.type, e.value.code) == (status, type_, status)
    assert e.value.message == "the replica went away"
    with pytest.raises(APIError) as default:
        raise_for(reason, None)
    outcome = for_reason(reason)
    assert outcome is not None and default.value.message == outcome.value.message
    assert status_of(reason, None) == status


@pytest.mark.parametrize("reason", [FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT,
                                    FinishReason.TIMEOUT, None])  # fmt: skip
def test_a_result_is_no_failure(reason: FinishReason | None) -> None:
    raise_for(reason, "ignored")  # raises nothing
    assert status_of(reason, None) is None
    assert status_of(reason, 499) == 499  # what the run raised wins


def test_what_a_stream_raised() -> None:
    fit = engine_failure(DoesNotFit("too long", "max_tokens"), "r1")
    assert (fit.status, fit.param) == (400, "max_tokens")
    assert engine_failure(StopAsyncIteration(), "r1").status == 500
    failed = engine_failure(RuntimeError("boom"), "r1")
    assert (failed.status, failed.type, failed.message) == (503, "unavailable_error",
                                                           "the engine failed: boom")  # fmt: skip
    assert failed.headers["Retry-After"] == "1"  # every 503 says when to come back
    own = APIError(429, "slow down")
    assert engine_failure(own, "r1") is own


def test_every_row_is_an_error_status_with_a_message() -> None:
    for outcome in Outcome:
        error = outcome.error("x")
        assert 400 <= error.status < 600 and error.message and "{}" not in error.message
    assert Outcome.ENGINE_DOWN.error("'m'").message == "the engine of model 'm' is not running"
