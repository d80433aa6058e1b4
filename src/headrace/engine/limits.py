"""Requests that could never run are refused at the door, with the limits stated."""

from __future__ import annotations


def check_fits(
    num_prompt_tokens: int, max_tokens: int, max_model_len: int, capacity_tokens: int
) -> None:
    """Raise ValueError, stating the limits, for a request that could never run."""
    total = num_prompt_tokens + max_tokens
    if num_prompt_tokens < 1:
        raise ValueError("the prompt is empty")
    if total > max_model_len:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
            f"exceeds the model's context of {max_model_len} tokens"
        )
    if total > capacity_tokens:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} "
            f"exceeds the KV cache's capacity of {capacity_tokens} tokens"
        )
