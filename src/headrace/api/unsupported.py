"""OpenAI and vLLM request fields that Headrace does not implement yet.

A field a caller sets expects a behaviour; ignoring it would answer 200 with something the
caller did not ask for. Each such field is accepted only at its "off" value (SDKs and proxies
send some of them as `null` or as their default) and refused otherwise with a 400 naming it.
Fields that do not change the output (`user`, `metadata`, `store`, ...) are accepted and
ignored; any other unknown field is refused by the schema (extra="forbid").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator

# field -> the values that mean "not used" (None always does)
_OFF: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "prompt_logprobs": (),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "continue_final_message": (False,),
    "add_generation_prompt": (True,),
    # /v1/responses
    "reasoning": (),
    "background": (False,),
    "include": ([],),
    "truncation": ("disabled",),
    "conversation": (),
    "max_tool_calls": (),
}


def _is_off(name: str, value: Any) -> bool:
    return value is None or any(value == off and type(value) is type(off) for off in _OFF[name])


class _Unsupported(BaseModel):
    """Refuses, naming the field, any of `_OFF`'s fields set to something other than off."""

    @field_validator("*", mode="after")
    @classmethod
    def _refuse_if_set(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        if name in _OFF and not _is_off(name, value):
            raise ValueError(f"`{name}` is not supported by this server yet; leave it out or null")
        return value


class _Common(_Unsupported):
    use_beam_search: Any = None
    length_penalty: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    # Accepted and ignored: they label or route a request, they do not change its output.
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None


class CompletionExtras(_Common):
    best_of: Any = None
    echo: Any = None
    suffix: Any = None
    prompt_logprobs: Any = None


class ChatExtras(_Common):
    functions: Any = None  # the deprecated forms of `tools` and `tool_choice`
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    continue_final_message: Any = None
    add_generation_prompt: Any = None


class ResponsesExtras(_Unsupported):
    """/v1/responses: what it does not implement yet, and what it accepts and ignores."""

    reasoning: Any = None
    background: Any = None
    include: Any = None
    truncation: Any = None
    conversation: Any = None
    max_tool_calls: Any = None
    user: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
