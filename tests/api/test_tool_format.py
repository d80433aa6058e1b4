"""Tool calling without a server: the grammar allows exactly the documented format (checked with
llguidance's matcher over the test tokenizer), the parser reads it back the same whether the
text comes whole or a character at a time, and the prompt carries tools and results."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import make_chat_tokenizer

from headrace.api.errors import APIError
from headrace.api.schemas import ChatMessage
from headrace.api.structured import grammar_cache
from headrace.api.tool_format import call_text
from headrace.api.tool_grammar import tool_grammar, tool_plan
from headrace.api.tool_parser import CallDelta, ToolCallParser, parse_calls
from headrace.api.tool_prompt import template_input
from headrace.api.tool_schemas import FunctionTool, ToolFields
from headrace.loader.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
NOOP = {"type": "function", "function": {"name": "noop"}}


def _fields(**body: Any) -> ToolFields:
    return ToolFields.model_validate({"tools": [WEATHER, NOOP], **body})


def _accepts(grammar: str, text: str) -> bool:
    """Whether the grammar lets the model write `text` and stop there."""
    from llguidance import LLMatcher, LLTokenizer

    tok = make_chat_tokenizer()
    table = LLTokenizer(tok.to_str(), n_vocab=tok.get_vocab_size(), eos_token=2)
    matcher = LLMatcher(table, grammar, log_level=0)
    ids = tok.encode(text, add_special_tokens=False).ids
    return bool(matcher.consume_tokens(ids)) and matcher.is_accepting()


PARIS = call_text("get_weather", '{"city": "Paris"}')
NOOP_CALL = call_text("noop", "{}")


@pytest.mark.parametrize(
    ("choice", "parallel", "text", "ok"),
    [
        ("auto", True, "just text, no call", True),
        ("auto", True, "I will look. " + PARIS, True),
        ("auto", True, "a <tool_call> then garbage", False),
        ("auto", True, call_text("get_weather", '{"town": "Paris"}'), False),
        ("required", True, "just text", False),
        ("required", True, PARIS + "\n" + NOOP_CALL, True),
        ("required", False, PARIS + "\n" + NOOP_CALL, False),
        ("required", True, call_text("delete_all", "{}"), False),
        ({"type": "function", "function": {"name": "noop"}}, True, PARIS, False),
        ({"type": "function", "function": {"name": "noop"}}, True, NOOP_CALL, True),
    ],
)
def test_the_grammar_allows_exactly_valid_calls(
    choice: Any, parallel: bool, text: str, ok: bool
) -> None:
    plan = tool_plan(_fields(tool_choice=choice, parallel_tool_calls=parallel))
    grammar = tool_grammar(plan, grammar_cache())
    assert grammar is not None
    assert _accepts(grammar, text) is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [('{"n": 3}', True), (PARIS, True), ("plain text", False), ('{"n": 3}' + PARIS, False),
     ('{"n": "x"}', False)],
)  # fmt: skip
def test_auto_with_an_answer_schema_allows_that_json_or_calls(text: str, ok: bool) -> None:
    answer = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    grammar = tool_grammar(tool_plan(_fields(tool_choice="auto")), grammar_cache(), answer)
    assert grammar is not None and _accepts(grammar, text) is ok


def test_with_calls_first_a_marker_inside_the_answer_is_text() -> None:
    answer = '{"s": "<tool_call>"}'
    parsed = parse_calls(answer, calls_first=True)
    assert parsed.text == answer and not parsed.calls
    assert [c.name for c in parse_calls(PARIS, calls_first=True).calls] == ["get_weather"]


def test_tool_choice_none_has_no_grammar() -> None:
    assert tool_grammar(tool_plan(_fields(tool_choice="none")), grammar_cache()) is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_a_choice_the_tools_cannot_meet_is_a_400(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        tool_plan(_fields(**body))
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize(
    "params", [{"type": "objectx"}, {"type": "string"}, {"type": "object", "minProperties": "x"}]
)
def test_a_schema_that_cannot_be_used_is_a_400_naming_its_tool(params: dict[str, Any]) -> None:
    bad = {"type": "function", "function": {"name": "bad", "parameters": params}}
    fields = ToolFields.model_validate({"tools": [WEATHER, bad], "tool_choice": "required"})
    with pytest.raises(APIError) as e:
        tool_grammar(tool_plan(fields), grammar_cache())
    assert e.value.status == 400 and e.value.param == "tools.1.function.parameters"


def test_the_parser_reads_the_same_calls_streamed_a_character_at_a_time() -> None:
    text = "Let me see. " + PARIS + "\n" + call_text("noop", '{"s": "a}\\"<tool_call>"}')
    whole = parse_calls(text)
    assert whole.text == "Let me see. "
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("noop", {"s": 'a}"<tool_call>'}),
    ]
    parser = ToolCallParser()
    pieces = [p for ch in text for p in parser.feed(ch)] + parser.finish()
    assert "".join(p for p in pieces if isinstance(p, str)) == whole.text
    starts = [p for p in pieces if isinstance(p, CallDelta) and p.id]
    assert [p.name for p in starts] == ["get_weather", "noop"] and starts[0].id != starts[1].id
    for i, call in enumerate(whole.calls):
        fragments = [p.arguments for p in pieces if isinstance(p, CallDelta) and p.index == i]
        assert "".join(fragments) == call.arguments


def test_a_call_cut_short_is_not_a_call_and_text_held_back_is_kept() -> None:
    cut = parse_calls(PARIS + "\n" + PARIS[:30])
    assert len(cut.calls) == 1 and cut.in_call
    assert parse_calls("ends with <tool").text == "ends with <tool"


HISTORY = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "c2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "rain"},
]  # fmt: skip


def test_the_generic_prompt_lists_tools_and_writes_calls_and_results_back() -> None:
    messages = [ChatMessage.model_validate(m) for m in HISTORY]
    tools = [FunctionTool.model_validate(WEATHER)]
    rendered, template_tools = template_input(messages, tools, lambda: False)
    assert template_tools is None
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert '"get_weather"' in rendered[0]["content"] and "<tool_call>" in rendered[0]["content"]
    assert rendered[2]["content"] == PARIS + "\n" + call_text("get_weather", '{"city": "Rome"}')
    assert rendered[3]["content"] == (
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
    )


def test_a_template_with_a_tool_format_gets_tools_and_calls_as_transformers_passes_them() -> None:
    template = (
        "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}"
        "{% if m.tool_calls %}{% for c in m.tool_calls %}call {{ c.function.name }} "
        "{{ c.function.arguments | tojson }};{% endfor %}{% elif m.role == 'tool' %}"
        "result {{ m.name }}={{ m.content }};{% else %}{{ m.content }};{% endif %}{% endfor %}"
    )
    tok = Tokenizer(make_chat_tokenizer(), {"chat_template": template})
    assert tok.renders_tools()
    messages = [ChatMessage.model_validate(m) for m in HISTORY]
    rendered, tools = template_input(messages, [FunctionTool.model_validate(WEATHER)], lambda: True)
    text = tok.apply_chat_template(rendered, tools=tools)
    assert text == (
        '[get_weather]Weather in Paris and Rome?;call get_weather {"city": "Paris"};'
        'call get_weather {"city": "Rome"};result get_weather=sunny;result get_weather=rain;'
    )
    assert not Tokenizer(make_chat_tokenizer(), {"chat_template": "{{ messages }}"}).renders_tools()
