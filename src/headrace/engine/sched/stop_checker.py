"""Token-level stop conditions, checked by the scheduler after each sampled token.

Stop strings are text-level and live with the detokenizer (`headrace.engine.frontend.stop_strings`).
"""

from __future__ import annotations

from headrace.request import Request, RequestStatus


def check_stop(req: Request, token: int, max_model_len: int) -> RequestStatus | None:
    """The finished status `req` reaches with its newest token `token`, if any."""
    params = req.params
    if not params.ignore_eos and token in req.eos_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if token in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if req.num_output_tokens >= params.max_tokens or req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def append_until_stop(
    req: Request, tokens: list[int], max_model_len: int
) -> tuple[RequestStatus | None, list[int]]:
    """Add a step's tokens to `req` up to the first that ends it; returns the status it
    reached (if any) and the tokens added."""
    for i, t in enumerate(tokens):
        req.output_token_ids.append(t)
        status = check_stop(req, t, max_model_len)
        if status is not None:
            return status, tokens[: i + 1]
    return None, tokens
