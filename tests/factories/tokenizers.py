"""Tokenizers trained in a few milliseconds, one per style the loader and the detokenizer meet.

- `make_sentencepiece_tokenizer`: Llama/Gemma style (Metaspace word boundaries, byte fallback).
- `make_byte_level_tokenizer`: GPT-2 style (byte-level BPE).
- `make_chat_tokenizer`: byte-level BPE that adds BOS, saved with a chat template
  (`CHAT_TOKENIZER_CONFIG`): the API tests' model, and `chat_tokenizer()` for in-process tests.
- `make_word_tokenizer`: token `wN` is id N (`WORD_VOCAB` ids): the parity tests' models.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from factories.engine import FAKE_EOS
from headrace.loader.tokenizer import Tokenizer as HeadraceTokenizer

SP_CORPUS = [
    "Hello world, this is a small corpus for the tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Stop strings are cut exactly. END of story.",
    "numbers 12345 and more words here; the end.",
]
SP_TOKENIZER_CONFIG = {
    "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
    "tokenizer_class": "PreTrainedTokenizerFast",
}  # fmt: skip

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CHAT_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Headrace serves language models over HTTP with continuous batching.",
    "Once upon a time there was a small model that wrote random words.",
    "Numbers 0123456789 and punctuation: commas, dots; colons!",
]
CHAT_TOKENIZER_CONFIG = {
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
    "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
}  # fmt: skip

WORD_VOCAB = 512
WORD_TOKENIZER_CONFIG = {
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
    "add_bos_token": True,
}  # fmt: skip


def make_sentencepiece_tokenizer() -> Tokenizer:
    """A Llama/Gemma-style tokenizer: Metaspace word boundaries, BPE with byte fallback."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=150, special_tokens=["<pad>", "<eos>", "<bos>"], limit_alphabet=60
    )
    tok.train_from_iterator(SP_CORPUS * 10, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):  # rare characters fall back to their UTF-8 bytes
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def make_byte_level_tokenizer() -> Tokenizer:
    """A GPT-2-style tokenizer: byte-level BPE, multi-byte characters split across tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SP_CORPUS * 10, trainer)
    return tok


def make_chat_tokenizer() -> Tokenizer:
    """Byte-level BPE (512 ids; `<unk>` 0, `<s>` 1, `</s>` 2) whose encoding starts with BOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CHAT_CORPUS * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def make_word_tokenizer() -> Tokenizer:
    """Word level: `<pad>` 0, `<s>` 1, `</s>` 2, `<unk>` 3, then `w4` ... `w511`."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, WORD_VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def word_prompt(n: int, start: int = 5) -> str:
    """`n` words of the word-level vocabulary (plus BOS when tokenized)."""
    return " ".join(f"w{start + i % 400}" for i in range(n))


def save_tokenizer(tok: Tokenizer, config: dict[str, Any], path: Path) -> None:
    """tokenizer.json and tokenizer_config.json in `path`, as a Hugging Face checkpoint has."""
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))


@cache
def chat_tokenizer() -> HeadraceTokenizer:
    """Headrace's own tokenizer over `make_chat_tokenizer`, chat template included: what an
    in-process app encodes prompts with (shared: the tests only read it)."""
    return HeadraceTokenizer(make_chat_tokenizer(), dict(CHAT_TOKENIZER_CONFIG), "llama")


class TokenizerAdapter:
    """A `tokenizers.Tokenizer` with the interface of headrace.loader.tokenizer.Tokenizer."""

    def __init__(self, tok: Tokenizer, eos_token_ids: tuple[int, ...] = (FAKE_EOS,)) -> None:
        self.tok = tok
        self.eos_token_ids = eos_token_ids
        self.vocab_size = tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens))
