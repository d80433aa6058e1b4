"""What the scheduler sends the runner for a request's logits processors: only for requests
that use one, and only the token history they read, so plain requests carry nothing extra."""

from __future__ import annotations

from headrace.engine.outputs import LogitsInputs
from headrace.request import Request


def logits_inputs(req: Request) -> LogitsInputs | None:
    """What `req`'s logits processors need for its next sampled token; None (the plain path)
    when it uses none, or only min_tokens and has reached it."""
    p = req.params
    if not p.processes_logits:
        return None
    banned: tuple[int, ...] = ()
    if req.num_output_tokens < p.min_tokens:
        eos = () if p.ignore_eos else req.eos_token_ids
        banned = tuple(dict.fromkeys(eos + p.stop_token_ids))
    if not (banned or p.uses_output_history or p.logit_bias):
        return None
    return LogitsInputs(
        output_token_ids=_history(req) if p.uses_output_history else [],
        prompt_token_ids=req.prompt_token_ids if p.repetition_penalty != 1 else [],
        banned_token_ids=banned,
    )


def _history(req: Request) -> list[int]:
    """The tokens generated so far, those of a resumed stream's earlier attempts included."""
    prior = min(req.params.prior_output_tokens, len(req.prompt_token_ids))
    earlier = req.prompt_token_ids[len(req.prompt_token_ids) - prior :] if prior else []
    return earlier + list(req.output_token_ids)
