"""Build a `tokenizers.Tokenizer` from a GGUF file's tokenizer metadata.

Supports llama.cpp's sentencepiece-style vocabularies (`tokenizer.ggml.model == "llama"`), which
is what Gemma files carry. The result is built the way transformers builds its GGUF tokenizer, so
both split text identically: a BPE with byte fallback over the vocabulary, merges rebuilt from the
vocabulary (Gemma files list none: file order is the merge priority), control tokens added as
special tokens and user-defined ones as plain added tokens.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from headrace.loader.errors import ModelLoadError

CONTROL, USER_DEFINED = 3, 4
SPIECE_SPACE = "\u2581"


def build_gguf_tokenizer(meta: dict[str, Any], source: str) -> tuple[Tokenizer, dict[str, Any]]:
    """GGUF metadata (`tokenizer.ggml.*` keys) -> tokenizer and a tokenizer_config dict."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "llama":
        raise ModelLoadError(
            f"{source}: GGUF tokenizer type {kind!r} is not supported; expected 'llama' "
            "(sentencepiece, as in Gemma files)"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [])
    # Gemma stores runs of spaces as real spaces; the BPE looks them up as U+2581 runs.
    spelled = [SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(spelled)}
    merges = _merges_in_file_order(vocab)
    config = _tokenizer_config(meta, tokens)
    bpe = BPE(
        vocab=vocab,
        merges=merges,
        unk_token=config["unk_token"],
        fuse_unk=True,
        byte_fallback=True,
        dropout=None,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    _add_tokens(tok, tokens, types, config)
    tok.post_processor = template_processor(tok, config)
    return tok, config


def _merges_in_file_order(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary pieces, earlier tokens first (a repeated
    spelling ranks where it last occurs); within a token, longer left pieces first. This is
    transformers' `generate_merges` order for these files."""
    merges: list[tuple[str, str]] = []
    for token in sorted(vocab, key=vocab.__getitem__):
        merges.extend(
            (token[:i], token[i:])
            for i in range(len(token) - 1, 0, -1)
            if token[:i] in vocab and token[i:] in vocab
        )
    return merges


def _name(meta: dict[str, Any], tokens: list[str], key: str) -> str | None:
    index = meta.get(f"tokenizer.ggml.{key}_token_id")
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def _tokenizer_config(meta: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bos_token": _name(meta, tokens, "bos"),
        "eos_token": _name(meta, tokens, "eos"),
        "unk_token": _name(meta, tokens, "unknown") or ("<unk>" if "<unk>" in tokens else None),
        "pad_token": _name(meta, tokens, "padding"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    if "<mask>" in tokens:
        config["mask_token"] = "<mask>"
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


def _add_tokens(
    tok: Tokenizer, tokens: list[str], types: list[int], config: dict[str, Any]
) -> None:
    named = [
        config[k]
        for k in ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")
        if config.get(k)
    ]
    control = [t for t, kind in zip(tokens, types, strict=False) if kind == CONTROL]
    specials = list(dict.fromkeys(named + control))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    vocab = tok.get_vocab()
    user = [
        t for t, kind in zip(tokens, types, strict=False) if kind == USER_DEFINED and t in vocab
    ]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def template_processor(tok: Tokenizer, config: dict[str, Any]) -> processors.TemplateProcessing:
    """BOS/EOS around the text as the config's add_bos_token / add_eos_token say."""
    bos = _content(config.get("bos_token")) if config.get("add_bos_token") else None
    eos = _content(config.get("eos_token")) if config.get("add_eos_token") else None
    head = f"{bos}:0 " if bos else ""
    single = f"{head}$A:0{f' {eos}:0' if eos else ''}"
    pair = f"{single}{f' {bos}:1' if bos else ''} $B:1{f' {eos}:1' if eos else ''}"
    special = [(t, tok.token_to_id(t)) for t in (bos, eos) if t]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _content(token: str | dict[str, Any] | None) -> str | None:
    if isinstance(token, dict):
        return str(token.get("content"))
    return token
