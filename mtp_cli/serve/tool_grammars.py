"""The grammars that force a tool call in each format (tool_choice "required" or a named function):
GBNF for llama.cpp's grammar sampler, argument values typed by the tools' JSON schemas where the
format can say it (JSON arguments: all of them; tagged ones: numbers, booleans, enums, arrays and
objects, strings as text without '<')."""

from __future__ import annotations

import json
import re
from typing import Any

from mtp_cli import schemas

Tool = dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}


def lit(s: str) -> str:
    """A GBNF string literal."""
    return json.dumps(s, ensure_ascii=False)


def names(tools: list[Tool]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def params(tool: Tool) -> dict[str, Any]:
    p = tool["function"].get("parameters")
    return p if isinstance(p, dict) and p else {"type": "object"}


def embedded(tools: list[Tool]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each tool's parameters as a schema to embed in another, and the `$defs` the embedding one
    must carry: every tool's whole schema (its own $defs inside it) under `$defs/tool-i`, its refs
    pointing there, so that Pydantic's $defs, "#" and recursive refs resolve from the new root."""
    out, defs = [], {}
    for i, t in enumerate(tools):
        p = params(t)
        if '"$ref"' in json.dumps(p):
            defs[f"tool-{i}"] = schemas.moved(p, f"#/$defs/tool-{i}")
            out.append({"$ref": f"#/$defs/tool-{i}"})
        else:
            out.append(p)
    return out, defs


def json_rules(schema: Any, root: str) -> str:
    """The converter's GBNF with its root rule renamed (to embed it in another grammar)."""
    return re.sub(r"^root ::=", f"{root} ::=", schemas.grammar(schema), flags=re.M)


def repeat(call: str, parallel: bool, sep: str = '"\\n"') -> str:
    return f"root ::= {call} ( {sep} {call} )*" if parallel else f"root ::= {call}"


def hermes_rules(tools: list[Tool], parallel: bool, key: str = "arguments") -> str:
    schemas, defs = embedded(tools)
    one = [
        {
            "type": "object",
            "properties": {"name": {"const": n}, key: p},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for n, p in zip(names(tools), schemas)
    ]
    top = {"oneOf": one} if len(one) > 1 else dict(one[0])
    body = json_rules({**top, "$defs": defs} if defs else top, "call-json")
    return repeat('"<tool_call>\\n" call-json "\\n</tool_call>"', parallel) + "\n" + body


# a property of no "type" is written as text, unless one of these says what it is
STRUCTURED = {"$ref", "anyOf", "oneOf", "allOf", "properties", "items", "const"}


def typed_values(tools: list[Tool], quote: str = "") -> tuple[str, dict[tuple[int, str], str]]:
    """GBNF for every tool parameter's value as tagged formats write it: a string (or a property of
    no type, nor a $ref or another structure) as text without '<', between `quote` marks; a string
    enum one of its values, so; anything else JSON, by the converter. (the rules, {(tool index,
    key): the value's expression})."""
    q = f"{lit(quote)} " if quote else ""
    qe = f" {lit(quote)}" if quote else ""
    exprs: dict[tuple[int, str], str] = {}
    typed: dict[str, Any] = {}
    owner: dict[str, tuple[int, str]] = {}
    _, defs = embedded(tools)
    for i, t in enumerate(tools):
        for j, (key, sch) in enumerate(params(t).get("properties", {}).items()):
            sch = schemas.moved(sch, f"#/$defs/tool-{i}") if isinstance(sch, dict) else {}
            enum = sch.get("enum")
            if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
                exprs[i, key] = f"( {q}( " + " | ".join(lit(v) for v in enum) + f" ){qe} )"
            elif (
                sch.get("type") == "string" or "enum" in sch or (sch.get("type") is None and not STRUCTURED & set(sch))
            ):
                exprs[i, key] = f"( {q}val{qe} )"
            else:
                typed[f"v-{i}-{j}"], owner[f"v-{i}-{j}"] = sch, (i, key)
    if not typed:
        return "", exprs
    rules = json_rules({"type": "object", "properties": typed, **({"$defs": defs} if defs else {})}, "typed-values")
    for name, at in owner.items():  # (the converter writes `NAME-kv ::= "\\"NAME\\"" space ":" space VALUE`)
        m = re.search(rf'^{re.escape(name)}-kv ::= .*?":" space (.*)$', rules, re.M)
        exprs[at] = f"( {m.group(1)} )" if m else "val"
    return rules, exprs


def tagged_rules(tools: list[Tool], head: str, arg: str, tail: str, parallel: bool) -> str:
    """Calls whose arguments are tagged key/value pairs: `head` and `arg` are format strings over
    the name, the key and the value (GBNF)."""
    typed, exprs = typed_values(tools)
    alts = []
    for i, t in enumerate(tools):
        keys = list(params(t).get("properties", {}))  # (none: a call without arguments)
        pairs = f"( {' | '.join(arg.format(key=lit(k), value=exprs[i, k]) for k in keys)} )*" if keys else ""
        alts.append(f"call-{i} ::= {head.format(name=lit(t['function']['name']))} {pairs} {tail}")
    calls = " | ".join(f"call-{i}" for i in range(len(tools)))
    return "\n".join([repeat(f"( {calls} )", parallel), *alts, "val ::= [^<]*", typed])


def qwen3_rules(tools: list[Tool], parallel: bool) -> str:
    return tagged_rules(
        tools,
        '"<tool_call>\\n<function=" {name} ">\\n"',
        '( "<parameter=" {key} ">\\n" {value} "\\n</parameter>\\n" )',
        '"</function>\\n</tool_call>"',
        parallel,
    )


def glm_rules(tools: list[Tool], parallel: bool) -> str:
    return tagged_rules(
        tools,
        '"<tool_call>" {name} "\\n"',
        '( "<arg_key>" {key} "</arg_key>\\n<arg_value>" {value} "</arg_value>\\n" )',
        '"</tool_call>"',
        parallel,
    )


DS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
)


def deepseek_rules(tools: list[Tool], parallel: bool) -> str:
    alts = " | ".join(lit(n) for n in names(tools))
    call = f"{lit(DS[1])} ( {alts} ) {lit(DS[2])} args {lit(DS[3])}"
    many = f"( {call} )+" if parallel else f"( {call} )"
    return f"root ::= {lit(DS[0])} {many} {lit(DS[4])}\n" + json_rules({"type": "object"}, "args")


def gemma4_rules(tools: list[Tool], parallel: bool) -> str:
    typed, exprs = typed_values(tools, quote='<|"|>')
    alts = []
    for i, t in enumerate(tools):
        keys = list(params(t).get("properties", {}))
        pair = " | ".join(f'{lit(k)} ":" {exprs[i, k]}' for k in keys)
        args = f'"{{" ( ( {pair} ) ( "," ( {pair} ) )* )? "}}"' if keys else '"{}"'
        alts.append(f"call-{i} ::= {lit(t['function']['name'])} {args}")
    calls = " | ".join(f"call-{i}" for i in range(len(tools)))
    return "\n".join(
        [repeat(f'"<|tool_call>call:" ( {calls} ) "<tool_call|>"', parallel, '""'), *alts, "val ::= [^<]*", typed]
    )


def llama3_rules(tools: list[Tool], parallel: bool) -> str:
    one = hermes_rules(tools, False, key="parameters").split("\n", 1)[1]
    return "root ::= call-json\n" + one


__all__ = [
    "Tool",
    "DS",
    "lit",
    "params",
    "hermes_rules",
    "qwen3_rules",
    "glm_rules",
    "deepseek_rules",
    "gemma4_rules",
    "llama3_rules",
]
