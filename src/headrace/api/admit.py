"""Admitting a request: every check, cheapest first (key, model, tenant limits), then the
prompt tokenized and its fit checked, then the gateway's admission; the `Job` that passed.
A known tenant's refusal goes to the ledger; an unknown caller's does not (it could fill it)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request

from headrace.api.arrival import arrival_time
from headrace.api.errors import APIError, bad_request
from headrace.api.job import Job
from headrace.api.logits_fields import processor_params
from headrace.api.schemas import SamplingFields
from headrace.api.state import AppState, Target
from headrace.api.structured import grammar_for
from headrace.api.usage_record import ledger_names, record_refusal
from headrace.engine.frontend.client import EngineClient, GenerateOptions
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.limits import DoesNotFit, check_fits
from headrace.gateway.base import Tenant
from headrace.gateway.errors import GatewayError
from headrace.metrics.timing import RequestTimer
from headrace.request import SamplingParams


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    tokenizer: Tokenizer,
    grammar: str | None = None,
) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    processors = processor_params(body, tokenizer, max_tokens)
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
            top_k=max(body.top_k, 0), seed=body.seed, stop=stop, ignore_eos=body.ignore_eos,
            logprobs=logprobs, stop_token_ids=tuple(body.stop_token_ids or ()), grammar=grammar,
            **processors,
        )  # fmt: skip
    except ValueError as e:
        raise bad_request(str(e)) from e


Grammar = Callable[[], Awaitable[str | None]]


async def admit(
    state: AppState,
    request: Request,
    body: SamplingFields,
    encode: Callable[[EngineClient], Awaitable[list[int]]],
    *,
    max_tokens: int | None,
    logprobs: int | None = None,
    id_prefix: str = "gen",
    n: int = 1,
    grammar: Grammar | None = None,
) -> Job:
    """All the checks, cheapest first; `encode` tokenizes the prompt for the chosen engine.
    `n` choices are admitted as one request whose output may be `n` times `max_tokens`.
    `grammar`: the request's grammar where a route makes its own (tools), instead of the
    constraint fields'. A known tenant's refusal goes to the ledger (an unknown caller's does
    not: it could fill it)."""
    tenant = caller(state, request)
    admitting = _admit(
        state, request, tenant, body, encode, max_tokens, logprobs, id_prefix, n, grammar
    )
    try:
        return await admitting
    except (APIError, GatewayError) as e:
        record_refusal(state, request, tenant, body.model, e.status)
        raise


def caller(state: AppState, request: Request) -> Tenant:
    """Who is asking: a batch line's owner (set in the scope by `batch_call`, in process),
    else the tenant of the request's key."""
    tenant = request.scope.get("headrace.tenant")
    if isinstance(tenant, Tenant):
        return tenant
    return state.gateway.authenticate(request.headers)


async def _admit(
    state: AppState,
    request: Request,
    tenant: Tenant,
    body: SamplingFields,
    encode: Callable[[EngineClient], Awaitable[list[int]]],
    max_tokens: int | None,
    logprobs: int | None,
    id_prefix: str,
    n: int,
    grammar: Grammar | None,
) -> Job:
    target = state.target(body.model, tenant)
    model, engine = target.model, target.engine
    state.gateway.check(tenant, target.base)
    ids = await encode(engine)
    max_tokens, params = await _params(state, body, engine, len(ids), max_tokens, logprobs, grammar)
    admission = state.gateway.admit(tenant, len(ids), n * max_tokens, target.base)
    arrival = arrival_time(request.scope)
    options = _options(state, body, tenant, target, arrival)
    rid = new_request_id(id_prefix)
    timer = RequestTimer(start=arrival)
    traceparent = request.headers.get("traceparent")
    job = Job(rid, model, engine, ids, params, options, admission, timer, traceparent)
    job.key_id, job.route = ledger_names(request)
    job.base, job.adapter = target.base, target.lora
    return job


async def _params(
    state: AppState,
    body: SamplingFields,
    engine: EngineClient,
    num_ids: int,
    max_tokens: int | None,
    logprobs: int | None,
    grammar: Grammar | None,
) -> tuple[int, SamplingParams]:
    """The output limit, checked to fit the context, and the sampling parameters."""
    if max_tokens is None:  # chat without a limit: the rest of the context
        max_tokens = max(engine.max_model_len - num_ids, 1)
    try:
        check_fits(num_ids, max_tokens, engine.max_model_len)
    except DoesNotFit as e:
        raise bad_request(str(e), e.param) from e
    eos_banned_for = 0 if body.ignore_eos else body.min_tokens or 0
    if grammar is None:
        constraint = await grammar_for(body, state.grammars, eos_banned_for)
    else:
        constraint = await grammar()
    return max_tokens, sampling_params(body, max_tokens, logprobs, engine.tokenizer, constraint)


def _options(
    state: AppState, body: SamplingFields, tenant: Tenant, target: Target, arrival: float
) -> GenerateOptions:
    return GenerateOptions(
        priority=tenant.priority, tenant=tenant.name, weight=tenant.weight,
        timeout_s=body.timeout or state.config.request_timeout_s,
        queue_timeout_s=tenant.queue_timeout_s, arrival_time=arrival,
        cache_salt=tenant.cache_salt, lora=target.lora,
    )  # fmt: skip
