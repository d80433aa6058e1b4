"""Requests that could never run are refused at the door, with the limits stated.

One check, in OpenAI's words, used wherever a request enters: the HTTP layer (the model's
context), a replica's front end (its KV cache too) and the scheduler (a core trusts no one).
"""

from __future__ import annotations


class DoesNotFit(ValueError):
    """A request that can never run; `param` names the field to change."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_fits(
    num_prompt_tokens: int,
    max_tokens: int,
    max_model_len: int,
    capacity_tokens: int | None = None,
) -> None:
    """Raise DoesNotFit for a request that could never run."""
    if num_prompt_tokens < 1:
        raise DoesNotFit("the prompt is empty", "prompt")
    total = num_prompt_tokens + max_tokens
    asked = (
        f"However, you requested {total} tokens ({num_prompt_tokens} in the prompt, "
        f"{max_tokens} for the completion). Please reduce the prompt or max_tokens."
    )
    param = "prompt" if num_prompt_tokens >= max_model_len else "max_tokens"
    if total > max_model_len:
        raise DoesNotFit(
            f"This model's maximum context length is {max_model_len} tokens. {asked}", param
        )
    if capacity_tokens is not None and total > capacity_tokens:
        param = "prompt" if num_prompt_tokens >= capacity_tokens else "max_tokens"
        raise DoesNotFit(
            f"This replica's KV cache holds at most {capacity_tokens} tokens. {asked}", param
        )
