"""Incremental detokenization: new text per new token, correct for multi-byte UTF-8 and for
SentencePiece word boundaries.

Decoding one token alone is wrong twice over: a character split across byte-fallback tokens
decodes to U+FFFD until its last byte arrives, and SentencePiece decoders drop the leading
space of the first token they see. So each new piece is the difference between decoding a
short window ending in the new tokens and the same window without them (vLLM's prefix and
read offsets); the window starts a few tokens back, in the prompt at first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_CONTEXT_TOKENS = 5  # how far back the window starts at first: enough for word boundaries
_REPLACEMENT = "\ufffd"


class TokenDecoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0  # window start
        self._read_offset = len(self._ids)  # tokens before this are already streamed

    def add(self, new_ids: Sequence[int]) -> str:
        """Text completed by `new_ids`; an unfinished character is held back."""
        self._ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the request: whatever is still held back, as it decodes."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self._ids):
            return ""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith(_REPLACEMENT) and not final):
            return ""  # no visible text yet (a special token, or a partial character)
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # The window never needs more than what follows the old read offset.
        drop = self._prefix_offset
        self._ids = self._ids[drop:]
        self._prefix_offset -= drop
        self._read_offset -= drop
        return full[len(prefix) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
