"""A finished request as its trace needs it (`--otlp-traces-endpoint`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.metrics.tracing import TracedRequest

if TYPE_CHECKING:
    from headrace.api.serving import RequestRun


def traced(run: RequestRun, prompt_tokens: int) -> TracedRequest:
    job, tenant = run.job, run.job.admission.tenant
    return TracedRequest(
        job.request_id, job.model, tenant.name, tenant.tier, run.replica, job.timer,
        prompt_tokens, run.completion_tokens, run.cached_tokens, run.reason, job.traceparent,
    )  # fmt: skip
