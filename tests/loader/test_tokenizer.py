"""Tokenizer: BOS handling and chat templates rendered like transformers; default templates."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import jinja2
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from headrace.loader.tokenizer import Tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "[{{ m['role'] | upper }}] {{ m['content'] | trim }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": " hi there "},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "bye"},
]
WORDS = ["hi", "there", "hello", "bye", "[", "]", "USER", "SYSTEM", "ASSISTANT", "Be", "brief."]


def _write(path: Path, specials: list[str], config: dict[str, Any]) -> Path:
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *specials, *WORDS])}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>", *specials])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    base = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    return path


def _ours(path: Path) -> Tokenizer:
    config = json.loads((path / "tokenizer_config.json").read_text())
    return Tokenizer.from_file(path / "tokenizer.json", config)


@pytest.mark.parametrize("add_bos", [True, False])
def test_encode_and_template_match_transformers(tmp_path: Path, add_bos: bool) -> None:
    from transformers import AutoTokenizer

    path = _write(tmp_path, [], {"add_bos_token": add_bos, "chat_template": TEMPLATE})
    ours, theirs = _ours(path), AutoTokenizer.from_pretrained(path)
    for text in ["hi there", "bye bye hello", "", "unknown words"]:
        assert ours.encode(text) == theirs(text)["input_ids"]
        assert (
            ours.encode(text, add_special_tokens=False)
            == theirs(text, add_special_tokens=False)["input_ids"]
        )
    for gen in (True, False):
        assert ours.apply_chat_template(MESSAGES, gen) == theirs.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=gen
        )
    assert ours.chat_template == TEMPLATE
    assert ours.bos_token_id == 1 and ours.eos_token_ids == (2,)
    assert ours.all_special_ids == [1, 2]
    ids = ours.encode("hello there")
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_template_can_refuse(tmp_path: Path) -> None:
    ours = _ours(_write(tmp_path, [], {"chat_template": TEMPLATE}))
    with pytest.raises(jinja2.TemplateError, match="no tools here"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_default_gemma_template(tmp_path: Path) -> None:
    specials = ["<start_of_turn>", "<end_of_turn>"]
    ours = _ours(_write(tmp_path, specials, {"add_bos_token": True}))
    assert ours.chat_template is None
    text = ours.apply_chat_template(MESSAGES)
    assert text == (
        "<s><start_of_turn>user\nBe brief.\n\nhi there<end_of_turn>\n"
        "<start_of_turn>model\nhello<end_of_turn>\n"
        "<start_of_turn>user\nbye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert ours.eos_token_ids == (2, ours.backend.token_to_id("<end_of_turn>"))
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        ours.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_default_chatml_and_generic_templates(tmp_path: Path) -> None:
    chatml = _ours(_write(tmp_path / "q", ["<|im_start|>", "<|im_end|>"], {}))
    assert chatml.apply_chat_template(MESSAGES[1:2]) == (
        "<|im_start|>user\n hi there <|im_end|>\n<|im_start|>assistant\n"
    )
    generic = _ours(_write(tmp_path / "g", [], {}))
    assert generic.apply_chat_template(MESSAGES[:2], add_generation_prompt=False) == (
        "<s>System: Be brief.\nUser:  hi there \n"
    )


def test_pickles(tmp_path: Path) -> None:
    ours = _ours(_write(tmp_path, [], {"chat_template": TEMPLATE, "add_bos_token": True}))
    ours.apply_chat_template(MESSAGES)  # compiles the template
    copy = pickle.loads(pickle.dumps(ours))
    assert copy.encode("hi there") == ours.encode("hi there") == [3, 4]
    assert copy.apply_chat_template(MESSAGES) == ours.apply_chat_template(MESSAGES)
