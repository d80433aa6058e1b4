"""Incremental detokenization and stop strings, on real (small, locally trained) tokenizers."""

from __future__ import annotations

import pytest

from headrace.engine.frontend.detokenizer import IncrementalDetokenizer
from headrace.engine.frontend.stop_strings import StopStringMatcher
from headrace.engine.frontend.text_stream import RequestTextStream
from headrace.engine.messages import RequestOutput
from headrace.request import FinishReason, SamplingParams

TEXTS = [
    "Hello world, the quick fox.",
    "wörld naïve café — déjà vu",
    "日本語のテキスト and 中文",
    "emoji 🙂🚀 in 👩‍👩‍👧 text",
    "  leading spaces\nand\tnew lines  ",
    "END of story. the end.",
]


def _stream(tokenizer, prompt_ids, out_ids, chunk=1):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    pieces = [detok.add(out_ids[i : i + chunk]) for i in range(0, len(out_ids), chunk)]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("kind", ["sp_tokenizer", "byte_level_tokenizer"])
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_streamed_text_is_exact_and_never_splits_a_character(request, kind, text, chunk):
    tok = request.getfixturevalue(kind)
    prompt_ids = tok.encode("The prompt says:").ids
    out_ids = tok.encode(" " + text).ids
    if kind == "sp_tokenizer":
        assert any(t.startswith("<0x") for t in tok.encode(text).tokens) or text.isascii()
    pieces = _stream(tok, prompt_ids, out_ids, chunk)
    full = tok.decode(prompt_ids + out_ids)
    expected = full[len(tok.decode(prompt_ids)) :]
    assert "".join(pieces) == expected
    assert not any("\ufffd" in p for p in pieces)


def test_word_boundaries_of_the_first_token_come_from_the_prompt(sp_tokenizer):
    tok = sp_tokenizer
    enc = tok.encode("Hello world, the end")
    split = next(i for i, t in enumerate(enc.tokens) if i > 0 and t.startswith("▁"))
    prompt_ids, out_ids = enc.ids[:split], enc.ids[split:]  # out starts "▁wor..."
    assert tok.decode(out_ids[:1]).startswith("w")  # alone, the space would be lost
    assert "".join(_stream(tok, prompt_ids, out_ids)) == " world, the end"


def test_special_tokens_are_skipped(sp_tokenizer):
    tok = sp_tokenizer
    eos = tok.token_to_id("<eos>")
    ids = tok.encode(" the end").ids + [eos]
    assert "".join(_stream(tok, tok.encode("Say").ids, ids)) == " the end"


@pytest.mark.parametrize(
    ("pieces", "stops", "expected", "stopped"),
    [
        (["Hello ", "wor", "ld"], ["world"], ["Hello ", "", ""], True),
        (["Hello ", "wor", "ds"], ["world"], ["Hello ", "", "words"], False),
        (["a", "bSTO", "Pc"], ["STOP"], ["a", "b", ""], True),
        (["xx", "y", "END"], ["yEN", "END"], ["xx", "", ""], True),
        (["one\n", "\ntwo"], ["\n\n"], ["one", ""], True),
        (["plain text"], [], ["plain text"], False),
        (["abc", "d"], ["abcdx", "bcd"], ["", "a"], True),
    ],
)
def test_stop_strings_cut_exactly_and_hold_back_partial_matches(pieces, stops, expected, stopped):
    m = StopStringMatcher(stops)
    streamed = [m.feed(p) for p in pieces]
    assert streamed == expected
    assert m.stopped is stopped
    tail = m.flush()
    text = "".join(pieces)
    if stopped:
        cut = min(text.find(s) for s in stops if s in text)
        assert "".join(streamed) + tail == text[:cut]
    else:
        assert "".join(streamed) + tail == text


def test_text_stream_cuts_a_stop_string_spanning_tokens(sp_tokenizer):
    tok = sp_tokenizer
    prompt_ids = tok.encode("Tell a story").ids
    out_ids = tok.encode(" Once upon a time. END of story. More text").ids
    stream = RequestTextStream("r", tok, prompt_ids, SamplingParams(stop=("END of",)))
    chunks = []
    for i, t in enumerate(out_ids):
        last = i == len(out_ids) - 1
        out = RequestOutput("r", [t], FinishReason.LENGTH if last else None, len(prompt_ids), i + 1)
        chunk = stream.process(out)
        if chunk is None:
            break
        chunks.append(chunk)
        assert "E" not in chunk.text or chunk.finished  # the partial match is never leaked
    assert chunks[-1].finish_reason is FinishReason.STOP
    assert "".join(c.text for c in chunks) == " Once upon a time. "
    assert stream.process(RequestOutput("r", [5], None)) is None  # late tokens are ignored
