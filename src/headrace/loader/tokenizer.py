"""Headrace's tokenizer: a `tokenizers.Tokenizer` plus what transformers adds around it
(BOS handling from tokenizer_config, special-token lists, chat templates)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from headrace.loader.chat_templates import TURN_END_TOKENS, default_template
from headrace.loader.errors import ModelLoadError
from headrace.loader.files import read_json


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """A model directory's tokenizer: tokenizer.json, tokenizer_config.json if there is one,
    and config.json's architecture (which picks a default chat template)."""
    config_path = model_dir / "tokenizer_config.json"
    config = read_json(config_path, "tokenizer config") if config_path.is_file() else None
    archs = read_json(model_dir / "config.json", "config.json").get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    return Tokenizer.from_file(model_dir / "tokenizer.json", config, arch)


class Tokenizer:
    def __init__(
        self,
        tokenizer: HFTokenizer,
        config: dict[str, Any] | None = None,
        architecture: str | None = None,
    ) -> None:
        self.config = dict(config or {})
        self.architecture = architecture  # picks the default chat template
        self._tok = tokenizer
        # As in transformers 5, tokenizer.json's post-processor alone decides about BOS/EOS;
        # tokenizer_config's add_bos_token / add_eos_token are ignored.
        self._compiled: dict[str, jinja2.Template] = {}
        self._reads_tools: dict[str, bool] = {}
        self._template = self.config.get("chat_template")
        if isinstance(self._template, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in self._template}
            self._template = named.get("default") or next(iter(named.values()), None)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (the engine sends it across processes); compiled templates are rebuilt."""
        state = dict(self.__dict__)
        state["_compiled"] = {}
        return state

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        tokenizer_config: dict[str, Any] | None = None,
        architecture: str | None = None,
    ) -> Tokenizer:
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception
            raise ModelLoadError(f"{path}: cannot read tokenizer: {e}") from e
        return cls(tok, tokenizer_config, architecture)

    @property
    def backend(self) -> HFTokenizer:
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    @property
    def chat_template(self) -> str | None:
        """The model's own template (None when it ships none and a default is used)."""
        return self._template if isinstance(self._template, str) else None

    @property
    def template_source(self) -> str:
        """The template `apply_chat_template` renders: the model's, else a family default."""
        return self.chat_template or default_template(self._tok.get_vocab(), self.architecture)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render like transformers. The text already holds BOS where the template puts it:
        encode it with add_special_tokens=False. `tools` (OpenAI's shape) reach the template
        as its `tools` variable."""
        extra = {} if tools is None else {"tools": tools}
        return self._compiled_template().render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            **extra,
            **self._special_token_strings(),
        )

    def renders_tools(self) -> bool:
        """Whether the chat template reads a `tools` variable (has a tool format of its own)."""
        source = self.template_source
        if source not in self._reads_tools:
            parsed = _environment().parse(source)
            self._reads_tools[source] = "tools" in meta.find_undeclared_variables(parsed)
        return self._reads_tools[source]

    def _compiled_template(self) -> jinja2.Template:
        source = self.template_source
        if source not in self._compiled:
            self._compiled[source] = _environment().from_string(source)
        return self._compiled[source]

    def _special_token_strings(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = self.config.get(key)
            out[key] = value.get("content") if isinstance(value, dict) else value
        return out

    def _id_of(self, key: str) -> int | None:
        name = self._special_token_strings().get(key)
        return self._tok.token_to_id(name) if name else None

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of("bos_token")

    @cached_property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The config's EOS plus the turn-end token of the chat format the vocabulary has."""
        ids = [self._id_of("eos_token")]
        ids += [self._tok.token_to_id(t) for t in TURN_END_TOKENS]
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    @cached_property
    def vocab_size(self) -> int:
        # cached: the tokenizers call builds the whole 262k-entry vocabulary map each time
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @cached_property
    def all_special_ids(self) -> list[int]:
        decoder = self._tok.get_added_tokens_decoder()
        return sorted(i for i, t in decoder.items() if t.special)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    """The sandbox transformers renders chat templates in, with the same helpers."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env
