from __future__ import annotations

import pytest

from headrace.gateway.errors import GatewayError
from headrace.gateway.ratelimit import TenantLimiter, TokenBucket


def test_bucket_refills_at_capacity_per_minute(clock) -> None:  # type: ignore[no-untyped-def]
    b = TokenBucket(600, clock)  # 10 tokens/s
    b.take(600)
    assert b.level() == 0
    assert b.wait_for(50) == pytest.approx(5.0)
    clock.advance(2)
    assert b.level() == pytest.approx(20)
    assert b.wait_for(50) == pytest.approx(3.0)
    assert b.reset_in() == pytest.approx(58.0)
    clock.advance(1000)
    assert b.level() == 600  # capped


def test_retry_after_says_when_the_tokens_are_back(clock) -> None:  # type: ignore[no-untyped-def]
    lim = TenantLimiter("bob", tokens_per_minute=600, max_concurrent=None, clock=clock)
    lim.reserve(1, 500)
    with pytest.raises(GatewayError) as e:
        lim.reserve(2, 250)  # 100 left, 150 short at 10 tokens/s
    err = e.value
    assert (err.status, err.error_type, err.reason) == (429, "rate_limit_error", "rate_limit")
    assert err.headers["retry-after-ms"] == "15000"
    assert err.headers["retry-after"] == "15"
    assert err.headers["x-ratelimit-limit-tokens"] == "600"
    assert err.headers["x-ratelimit-remaining-tokens"] == "100"
    assert err.headers["x-ratelimit-reset-tokens"] == "50s"
    clock.advance(14.9)
    with pytest.raises(GatewayError):
        lim.reserve(2, 250)
    clock.advance(0.1)
    lim.reserve(2, 250)  # exactly when Retry-After said


def test_refunds_are_exact(clock) -> None:  # type: ignore[no-untyped-def]
    lim = TenantLimiter("bob", tokens_per_minute=10_000, max_concurrent=None, clock=clock)
    lim.reserve(1, 1000)  # prompt 200 + max_tokens 800
    lim.reserve(2, 3000)
    assert lim.remaining() == 6000
    lim.settle(1, 1000, 237)  # generated 37 of 800
    assert lim.remaining() == 10_000 - 3000 - 237
    lim.settle(1, 1000, 237)  # a second settle refunds nothing
    assert lim.remaining() == 10_000 - 3000 - 237
    lim.settle(2, 3000, 3000)  # used all it reserved
    assert lim.remaining() == 10_000 - 3000 - 237
    assert lim.bucket is not None
    assert lim.bucket.level() == 10_000 - 3237  # not a token lost to rounding
    assert lim.in_flight == {}


def test_request_larger_than_the_minute_budget(clock) -> None:  # type: ignore[no-untyped-def]
    lim = TenantLimiter("bob", tokens_per_minute=600, max_concurrent=None, clock=clock)
    with pytest.raises(GatewayError) as e:
        lim.reserve(1, 601)
    assert e.value.status == 429 and "lower max_tokens" in e.value.message
    assert "retry-after" not in e.value.headers  # waiting would not help
    assert lim.remaining() == 600


def test_cheap_check_refuses_an_empty_bucket(clock) -> None:  # type: ignore[no-untyped-def]
    lim = TenantLimiter("bob", tokens_per_minute=600, max_concurrent=None, clock=clock)
    lim.check()
    lim.reserve(1, 600)
    with pytest.raises(GatewayError) as e:
        lim.check()
    assert e.value.headers["retry-after-ms"] == "100"  # one token at 10 tokens/s
    lim.settle(1, 600, 100)
    lim.check()


def test_concurrency_limit_and_its_retry_after(clock) -> None:  # type: ignore[no-untyped-def]
    lim = TenantLimiter("acme", tokens_per_minute=None, max_concurrent=2, clock=clock)
    lim.reserve(1, 10)
    lim.reserve(2, 10)
    with pytest.raises(GatewayError) as e:
        lim.check()
    assert e.value.headers["retry-after"] == "1"  # no history yet: a second
    assert "limit is 2" in e.value.message
    clock.advance(4)
    lim.settle(1, 10, 10)  # took 4 s
    lim.reserve(3, 10)
    clock.advance(1)
    with pytest.raises(GatewayError) as e:
        lim.reserve(4, 10)
    # The oldest in flight (ticket 2) is 5 s old, past the 4 s average: retry soon.
    assert e.value.headers["retry-after-ms"] == "50"
    lim.settle(2, 10, 10)
    clock.advance(1)
    lim.reserve(4, 10)
    with pytest.raises(GatewayError) as e:
        lim.check()
    # Average now 4.2 s; the oldest (ticket 3) is 2 s old: about 2.2 s to go.
    assert e.value.headers["retry-after-ms"] == "2200"
    assert e.value.headers["retry-after"] == "3"
    assert lim.headers() == {}  # no token limit, no token headers
