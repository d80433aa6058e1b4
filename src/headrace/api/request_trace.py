"""A finished request as its trace needs it (`--otlp-traces-endpoint`)."""

from __future__ import annotations

from headrace.api.job import FinishedRun
from headrace.metrics.tracing import TracedRequest


def traced(run: FinishedRun, prompt_tokens: int) -> TracedRequest:
    job, tenant = run.job, run.job.admission.tenant
    return TracedRequest(
        job.request_id, job.model, tenant.name, tenant.tier, run.replica, job.timer,
        prompt_tokens, run.completion_tokens, run.cached_tokens, run.reason, job.traceparent,
    )  # fmt: skip
