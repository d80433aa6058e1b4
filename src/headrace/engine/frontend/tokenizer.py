"""What the front end needs of a tokenizer (`headrace.loader.tokenizer.Tokenizer` is one).

Only the front end holds one: it encodes prompts, renders chat templates, turns words into
token ids (bad_words) and decodes what the core generates. The core sees token ids only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The conversation as text (BOS included where the template puts it); `tools`, in
        OpenAI's shape, become the template's `tools` variable."""
        ...

    def renders_tools(self) -> bool:
        """Whether the chat template has a tool format of its own (reads `tools`)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Tokens that end a sequence beside the model's own (the chat format's turn end)."""
        ...
