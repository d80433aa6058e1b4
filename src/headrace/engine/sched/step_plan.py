"""From a step's plan (how many tokens each request computes) to what the runner is handed."""

from __future__ import annotations

from headrace.engine.logits_inputs import logits_inputs
from headrace.engine.outputs import ScheduledRequest
from headrace.request import Request


def scheduled_request(
    req: Request, n: int, drafts: list[int], block_ids: list[int]
) -> ScheduledRequest:
    """`req`'s next `n` known tokens, then its speculative `drafts` (if any)."""
    start = req.num_computed_tokens
    sample = start + n == req.num_tokens
    return ScheduledRequest(
        request_id=req.request_id,
        token_ids=token_slice(req, start, n) + drafts,
        start_pos=start,
        block_ids=block_ids,
        sample=sample,
        params=req.params,
        num_output_tokens=req.num_output_tokens,
        logits_inputs=logits_inputs(req) if sample else None,
        draft_token_ids=drafts,
        lora_id=req.lora_id,
    )


def prompt_tokens(s: ScheduledRequest, req: Request) -> int:
    """How many of the step's tokens for `req` are prompt tokens (the rest: generated ones)."""
    return max(0, min(len(s.token_ids), req.num_prompt_tokens - s.start_pos))


def token_slice(req: Request, start: int, n: int) -> list[int]:
    """all_token_ids[start : start + n] without copying a long prompt for every decode."""
    p = req.num_prompt_tokens
    if start >= p:
        return req.output_token_ids[start - p : start - p + n]
    if start + n <= p:
        return req.prompt_token_ids[start : start + n]
    return req.all_token_ids[start : start + n]
