"""Chat templates used when a model ships none, chosen by the tokens its vocabulary has."""

from __future__ import annotations

GEMMA = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

CHATML = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

LLAMA3 = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{%- endif -%}"
)

GENERIC = (
    "{{ bos_token or '' }}"
    "{%- for message in messages -%}"
    "{{ message['role'] | capitalize + ': ' + message['content'] + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)

# (marker token in the vocabulary, template, the token that ends a turn)
FAMILIES: list[tuple[str, str, str | None]] = [
    ("<start_of_turn>", GEMMA, "<end_of_turn>"),
    ("<|im_start|>", CHATML, "<|im_end|>"),
    ("<|start_header_id|>", LLAMA3, "<|eot_id|>"),
]

TURN_END_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>")


BY_ARCHITECTURE = {
    "Gemma3ForCausalLM": GEMMA,
    "Qwen2ForCausalLM": CHATML,
    "Qwen3ForCausalLM": CHATML,
}


def default_template(vocab: dict[str, int], architecture: str | None = None) -> str:
    """By architecture where it settles the format, else by the vocabulary's markers."""
    if architecture in BY_ARCHITECTURE:
        return BY_ARCHITECTURE[architecture]
    for marker, template, _ in FAMILIES:
        if marker in vocab:
            return template
    return GENERIC
