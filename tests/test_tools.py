"""Tool calls (mtp_cli.serve.tools): each family's format found in its template, its output parsed
into calls, and a forced call's grammar, which llama.cpp parses and under which the tiny model's
greedy output parses back into calls with schema-typed arguments (drafting changes nothing)."""

from __future__ import annotations

import json
import re

import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.errors import ConfigError
from mtp_cli.runtime import Runtime
from mtp_cli.serve.tools import FORMATS, format_of, generic_messages, plan
from tests.parity import PROMPT, greedy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"enum": ["c", "f"]},
                "alerts": {"type": "boolean"},
            },
            "required": ["city"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
# a tool whose every argument is bounded (the tiny model never closes an open string)
COUNT = {
    "type": "function",
    "function": {
        "name": "count",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "unit": {"enum": ["c", "f"]}, "fast": {"type": "boolean"}},
            "required": ["n", "unit", "fast"],
        },
    },
}
DS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
)
SAMPLES = [
    (
        "hermes",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
        "Let me look.",
        [("get_weather", {"city": "Paris", "days": 2}), ("ping", {})],
    ),
    (
        "qwen3-coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
        "</parameter>\n<parameter=alerts>\ntrue\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", {"city": "Paris", "days": 2, "alerts": True})],
    ),
    (
        "glm",
        "Sure.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>2</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>2</arg_value>\n</tool_call>",
        "Sure.",
        [("get_weather", {"city": "2", "days": 2})],  # (city is a string: kept as text)
    ),
    (
        "deepseek",
        f'{DS[0]}{DS[1]}get_weather{DS[2]}{{"city": "Paris"}}{DS[3]}'
        f"{DS[1]}function{DS[2]}ping\n```json\n{{}}\n```{DS[3]}{DS[4]}",
        "",
        [("get_weather", {"city": "Paris"}), ("ping", {})],
    ),
    (
        "gemma4",
        'ok<|tool_call>call:get_weather{city:<|"|>Paris, FR<|"|>,days:2,alerts:false,extra:[1,{a:null}]}<tool_call|>',
        "ok",
        [("get_weather", {"city": "Paris, FR", "days": 2, "alerts": False, "extra": [1, {"a": None}]})],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", {"city": "Paris"})],
    ),
]


@pytest.mark.parametrize("name, text, content, calls", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_each_format_parses_its_calls(name, text, content, calls):
    got_content, got = FORMATS[name].parse(text, [WEATHER, PING])
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert all(c.id.startswith("call_") for c in got) and len({c.id for c in got}) == len(got)
    plain = "No tools needed, the answer is 4."
    assert FORMATS[name].parse(plain, [WEATHER]) == (plain, [])


def test_a_malformed_call_is_left_as_text():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    assert FORMATS["hermes"].parse(text, [WEATHER]) == (text, [])


@pytest.mark.parametrize(
    "template, knows, want",
    [
        ("{{ '<|tool_call>call:' }}", True, "gemma4"),
        ("<tool_call><function=x><parameter=y>", True, "qwen3-coder"),
        ("<tool_call>{{name}}<arg_key>k</arg_key>", True, "glm"),
        ("{{'<｜tool▁calls▁begin｜>'}}", True, "deepseek"),
        ("{{- '<tool_call>\\n' }}", True, "hermes"),
        ("<|start_header_id|>ipython", True, "llama3"),
        ("<|user|>{{ message['content'] }}", False, "generic"),
    ],
)
def test_the_format_is_found_in_the_template(template, knows, want):
    assert format_of(template, knows) is FORMATS[want]


@pytest.fixture(scope="module")
def rt(tiny_models):
    with Runtime.load(tiny_models("glm4moe", head_noise=1.0)["full"], spec_type="mtp") as r:
        yield r


@pytest.mark.parametrize("name", ["hermes", "qwen3-coder", "glm", "deepseek", "gemma4", "llama3"])
@pytest.mark.parametrize("parallel", [False, True])
def test_a_forced_call_parses_back_typed_and_drafting_changes_nothing(rt, name, parallel):
    fmt = FORMATS[name]
    gbnf = fmt.rules([COUNT, PING], parallel)
    lx.Grammar(rt.model, gbnf).close()  # (llama.cpp parses it)
    cfg = greedy(n_predict=160, grammar=gbnf)
    gen = rt.generate(rt.tokenize(PROMPT), cfg)
    text = "".join(e.text for e in gen)
    content, calls = fmt.parse(text, [COUNT, PING])
    assert calls and content == "", (name, text)
    if not parallel:
        assert len(calls) == 1, text
    for c in calls:
        args = json.loads(c.arguments)
        if c.name == "count":
            assert set(args) <= {"n", "unit", "fast"} and args.get("unit", "c") in ("c", "f"), text
            assert isinstance(args.get("n", 0), int) and isinstance(args.get("fast", True), bool), text
        else:
            assert c.name == "ping" and args == {}, text
    drafted = rt.generate(rt.tokenize(PROMPT), greedy(n_predict=160, grammar=gbnf, spec_type="mtp", draft_n_max=3))
    assert "".join(e.text for e in drafted) == text


def test_a_plan_names_what_is_malformed_and_none_means_no_tools():
    fmt = FORMATS["hermes"]
    assert plan([WEATHER], "none", None, fmt) is None and plan([], "auto", None, fmt) is None
    auto = plan([WEATHER, PING], "auto", None, fmt)
    assert auto is not None and auto.forced is None and auto.grammar() is None and auto.parallel
    named = plan([WEATHER, PING], {"type": "function", "function": {"name": "ping"}}, True, fmt)
    assert named is not None and named.forced == [PING] and not named.parallel and "ping" in (named.grammar() or "")
    for tools, choice, says in (
        ([{"type": "function"}], "auto", "`tools.0` must be"),
        ([{"type": "function", "function": {}}], "auto", "`tools.0.function.name`"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "names no tool"),
    ):
        with pytest.raises(ConfigError, match=says):
            plan(tools, choice, None, fmt)


def test_a_template_without_tools_gets_them_in_a_system_message_and_calls_written_out():
    msgs = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ping", "arguments": {}}}]},
        {"role": "tool", "content": "pong", "tool_call_id": "call_1"},
    ]
    out = generic_messages(msgs, [PING])
    assert out[0]["role"] == "system" and "ping" in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert "tool_calls" not in out[2] and '"name": "ping"' in out[2]["content"] and out[3]["content"] == "pong"
    assert msgs[1]["tool_calls"]  # (the request's own messages are left as they were)


ADDRESS = {"type": "object", "properties": {"zip": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["zip"]}
# what pydantic writes for a nested model (instructor, pydantic-ai, openai-agents, pydantic_function_tool)
NESTED = {
    "type": "function",
    "function": {
        "name": "ship",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"$ref": "#/$defs/Address"},
                "back": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
            },
            "required": ["to"],
            "$defs": {"Address": ADDRESS},
        },
    },
}
# a recursive one (a tree), and one of the old spelling `definitions` pointing at itself
TREE = {
    "type": "function",
    "function": {
        "name": "tree",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}},
            "required": ["n"],
        },
    },
}
OLD = {
    "type": "function",
    "function": {
        "name": "old",
        "parameters": {
            "type": "object",
            "properties": {"a": {"$ref": "#/definitions/A"}},
            "required": ["a"],
            "definitions": {
                "A": {"type": "object", "properties": {"b": {"$ref": "#/definitions/B"}}, "required": ["b"]},
                "B": {"enum": [1, 2]},
            },
        },
    },
}


@pytest.mark.parametrize("name", ["hermes", "qwen3-coder", "glm", "gemma4", "llama3"])
def test_a_forced_call_whose_parameters_use_refs_gets_its_grammar(rt, name):
    """$defs / definitions and $refs (nested, under anyOf, recursive, "#") resolve wherever the schema
    sits in the call's grammar (was: "Error resolving ref", a 500), which llama.cpp parses; with JSON
    arguments the output parses back typed; tagged formats write a $ref'd value as typed JSON."""
    fmt = FORMATS[name]
    for tool in (NESTED, TREE, OLD):
        gbnf = fmt.rules([tool], False)
        lx.Grammar(rt.model, gbnf).close()
        if name not in ("hermes", "llama3"):  # (the tiny model may repeat tagged pairs past n_predict)
            call = next(line for line in gbnf.splitlines() if line.startswith("call-0 ::="))
            assert not re.search(r"\bval\b", call), gbnf  # (no value of these tools is text)
            continue
        text = "".join(e.text for e in rt.generate(rt.tokenize(PROMPT), greedy(n_predict=200, grammar=gbnf)))
        content, calls = fmt.parse(text, [tool])
        assert len(calls) == 1 and calls[0].name == tool["function"]["name"], (name, text)
        args = json.loads(calls[0].arguments)
        if tool is NESTED:
            assert isinstance(args["to"]["zip"], int), text
        if tool is OLD:
            assert args["a"]["b"] in (1, 2), text


def test_a_tool_schema_the_converter_cannot_take_is_a_400_naming_the_tool():
    bad = {
        "type": "function",
        "function": {
            "name": "lost",
            "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/Nowhere"}}},
        },
    }
    p = plan([PING, bad], "required", None, FORMATS["hermes"])
    with pytest.raises(
        ConfigError, match=r"`tools.1.function.parameters.properties.x` \(lost\): \$ref: .*Nowhere.* points to nothing"
    ):
        p.grammar()
