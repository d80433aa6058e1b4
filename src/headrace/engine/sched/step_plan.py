"""From a step's plan (how many tokens each request computes) to what the runner is handed."""

from __future__ import annotations

from headrace.engine.logits_inputs import logits_inputs
from headrace.engine.outputs import ScheduledRequest
from headrace.request import Request


def scheduled_request(
    req: Request, n: int, drafts: list[int], block_ids: list[int], table_epoch: int = 0
) -> ScheduledRequest:
    """`req`'s next `n` known tokens, then its speculative `drafts` (if any)."""
    start = req.num_computed_tokens
    sample = start + n == len(req.prompt_token_ids) + len(req.output_token_ids)  # num_tokens
    tokens = token_slice(req, start, n)
    return ScheduledRequest(
        request_id=req.request_id,
        token_ids=tokens + drafts if drafts else tokens,
        start_pos=start,
        block_ids=block_ids,
        sample=sample,
        params=req.params,
        num_output_tokens=len(req.output_token_ids),
        logits_inputs=logits_inputs(req) if sample and req.params.processes_logits else None,
        draft_token_ids=drafts,
        lora_id=req.lora_id,
        table_epoch=table_epoch,
    )


def token_slice(req: Request, start: int, n: int) -> list[int]:
    """all_token_ids[start : start + n] without copying a long prompt for every decode."""
    p = len(req.prompt_token_ids)
    if start >= p:
        return req.output_token_ids[start - p : start - p + n]
    if start + n <= p:
        return req.prompt_token_ids[start : start + n]
    return req.all_token_ids[start : start + n]
