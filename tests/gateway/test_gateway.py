from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from headrace.gateway.base import Tenant
from headrace.gateway.errors import GatewayError
from headrace.gateway.gateway import TenantGateway


@pytest.fixture
def gw(tenants_file: Path, clock) -> TenantGateway:  # type: ignore[no-untyped-def]
    return TenantGateway.from_file(tenants_file, clock=clock, max_queued_requests=50)


def who(gw: TenantGateway, key: str) -> Tenant:
    return gw.authenticate({"authorization": f"Bearer {key}"})


def test_over_its_limit_one_tenant_waits_while_another_goes(gw: TenantGateway) -> None:
    bob, acme = who(gw, "bob-key"), who(gw, "acme-key")
    a = gw.admit(bob, 100, 400, "m")  # bob: 600 tokens per minute
    assert a.headers["x-ratelimit-remaining-tokens"] == "100"
    with pytest.raises(GatewayError) as e:
        gw.admit(bob, 100, 400, "m")
    assert e.value.status == 429
    assert e.value.headers["retry-after"] == "40"  # 400 short at 10 tokens/s
    b = gw.admit(acme, 100, 400, "m")  # acme is unaffected
    gw.started(b, queue_time_s=0.01, ttft_s=0.05)
    gw.release(b, 180, "stop")
    # bob's request ended early: 120 of 500 used, 380 back, enough for another.
    gw.release(a, 120, "stop")
    assert gw.limiters["bob"].remaining() == 480
    c = gw.admit(bob, 100, 380, "m")
    gw.release(c, 480)
    assert gw.limiters["bob"].remaining() == 0
    with pytest.raises(GatewayError):
        gw.check(bob)  # the cheap pre-check sees the empty budget too
    assert gw.num_open == 0


def test_concurrency_and_double_release(gw: TenantGateway) -> None:
    acme = who(gw, "acme-key")
    a1 = gw.admit(acme, 10, 10)
    a2 = gw.admit(acme, 10, 10)
    with pytest.raises(GatewayError) as e:
        gw.check(acme)
    assert e.value.status == 429 and "retry-after" in e.value.headers
    gw.release(a1, 20)
    gw.release(a1, 20)  # twice: no second refund, no negative in-flight count
    assert len(gw.limiters["acme"].in_flight) == 1
    gw.check(acme)
    gw.release(a2, 5)
    assert gw.limiters["acme"].remaining() == 6000 - 25


def test_queue_bound_and_started(tenants_file: Path, clock) -> None:  # type: ignore[no-untyped-def]
    gw = TenantGateway.from_file(tenants_file, clock=clock, max_queued_requests=2)
    carol, acme = who(gw, "carol-key"), who(gw, "acme-key")
    c1, c2 = gw.admit(carol, 5, 5), gw.admit(carol, 5, 5)
    with pytest.raises(GatewayError) as e:
        gw.check(carol)
    assert (e.value.status, e.value.error_type) == (503, "overloaded_error")
    assert "retry-after" in e.value.headers
    gw.check(acme)  # paid requests are not queued behind free ones
    gw.started(c1, 0.2, 0.3)  # c1 left the queue: room for one more
    c3 = gw.admit(carol, 5, 5)
    for a in (c1, c2, c3):
        gw.release(a, 10)
    assert gw.shedder.queued_ahead("", 9) == (0, 0)


def test_metrics_by_tenant_and_tier(gw: TenantGateway) -> None:
    registry = CollectorRegistry()
    registry.register(gw.metrics)
    bob, crunch = who(gw, "bob-key"), who(gw, "crunch-key")
    with pytest.raises(GatewayError):
        who(gw, "nope")
    a = gw.admit(bob, 100, 100)
    with pytest.raises(GatewayError):
        gw.admit(bob, 300, 200)
    gw.started(a, queue_time_s=0.02, ttft_s=0.2)
    gw.release(a, 150, "stop")
    d = gw.admit(crunch, 10, 10)
    gw.release(d, 0, "overloaded")  # not started within its deadline
    text = generate_latest(registry).decode()

    def value(line: str) -> float:
        return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])

    assert value('headrace:gateway_requests_admitted_total{tenant="bob",tier="free"}') == 1
    rejected = "headrace:gateway_requests_rejected_total"
    assert value(f'{rejected}{{reason="auth",') == 1
    assert value(f'{rejected}{{reason="rate_limit",tenant="bob",tier="free"}}') == 1
    assert value(f'{rejected}{{reason="deadline",tenant="crunch",tier="batch"}}') == 1
    assert value('headrace:gateway_tokens_total{tenant="bob",tier="free"}') == 150
    assert value('headrace:gateway_requests_in_flight{tenant="bob",tier="free"}') == 0
    assert value('headrace:gateway_requests_queued{tier="batch"}') == 0


def test_build_and_connect(tenants_file: Path, tmp_path: Path) -> None:
    from headrace.config import GatewayConfig
    from headrace.engine.messages import StepStats
    from headrace.gateway.base import OpenGateway
    from headrace.gateway.setup import build_gateway, connect_gateway
    from headrace.gateway.tenants import TenantsFileError
    from headrace.metrics.prometheus import Metrics

    assert isinstance(build_gateway(GatewayConfig()), OpenGateway)
    shedding = build_gateway(GatewayConfig(max_queued_requests=8))
    assert isinstance(shedding, TenantGateway) and shedding.is_open
    gw = build_gateway(GatewayConfig(tenants=str(tenants_file), admin_key="k"))
    assert isinstance(gw, TenantGateway) and not gw.is_open and gw.protects_metrics
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: {x: {tier: gold, api_key_sha256: []}}")
    with pytest.raises(TenantsFileError, match="bad.yaml: tenants.x.tier"):
        build_gateway(GatewayConfig(tenants=str(bad)))

    class Engine:  # only stats() is read
        def stats(self) -> StepStats:
            return StepStats(step_duration=0.1, num_batched_tokens=50, num_waiting=2)

    metrics = Metrics()
    connect_gateway(gw, lambda: {"m": Engine()}, metrics)  # type: ignore[dict-item]
    assert gw.shedder.throughput("m") == pytest.approx(500.0)
    gw.admit(who(gw, "carol-key"), 3, 4, "m")
    body, _ = metrics.render()
    assert b'headrace:gateway_requests_admitted_total{tenant="carol",tier="free"} 1.0' in body


def test_only_normal_finishes_teach_the_output_ratio(gw: TenantGateway) -> None:
    carol = who(gw, "carol-key")
    for reason in ("abort", "error", "timeout", "overloaded", None):
        a = gw.admit(carol, 10, 90)
        gw.started(a)
        gw.release(a, 11, reason)  # one token, then hung up (or failed)
    never_started = gw.admit(carol, 10, 90)
    gw.release(never_started, 11, "stop")
    assert gw.shedder.ratios.of("carol") == 1.0 and gw.shedder.output_ratio == 1.0
    a = gw.admit(carol, 10, 90)
    gw.started(a)
    gw.release(a, 30, "stop")
    assert gw.shedder.ratios.of("carol") == pytest.approx(0.3)  # 30 of 100 reserved
    assert gw.shedder.ratios.of("bob") == gw.shedder.output_ratio  # no history: the mean
