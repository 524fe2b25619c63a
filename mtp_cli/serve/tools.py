"""Tool calls: the model's own format, found in its chat template; the calls parsed out of its output;
a grammar that forces one (tool_choice "required" or a named function).

No well-kept Python library parses the tool-call formats of open models without pulling in a
whole serving stack (vLLM's parsers, transformers' templates), so these follow llama.cpp's
(common/chat.cpp and common/parsers/) for the families mtp-cli runs:

    hermes        <tool_call>{"name": .., "arguments": {..}}</tool_call>    Qwen 2.5/3, Hermes, SmolLM3
    qwen3-coder   <tool_call><function=NAME><parameter=K>V</parameter>..    Qwen3-Coder, Qwen3.5, Step 3.5
    glm           <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>..   GLM-4.5 and later
    deepseek      <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>   DeepSeek V3 / V3.1
    gemma4        <|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>   Gemma 4
    llama3        {"name": .., "parameters": {..}}                           Llama 3.x JSON
    generic       a template that knows no tools: the tools are described in a system message and
                  called in the hermes form
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from mtp_cli import schemas
from mtp_cli.errors import ConfigError
from mtp_cli.serve.tool_grammars import (
    DS,
    Tool,
    deepseek_rules,
    gemma4_rules,
    glm_rules,
    hermes_rules,
    llama3_rules,
    params,
    qwen3_rules,
)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # a JSON object, as OpenAI's API carries it
    id: str


def _call(name: str, args: Any) -> Call:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return Call(name.strip(), text, "call_" + secrets.token_hex(12))


def _value(text: str, tool: Optional[Tool], key: str) -> Any:
    """A tagged argument's value: text where the schema says string, else JSON where it parses."""
    kind = ((tool and params(tool).get("properties", {}).get(key)) or {}).get("type")
    if kind != "string":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


@dataclass(frozen=True)
class ToolFormat:
    name: str
    opener: str  # where calls begin in the output (the content stream stops there)
    pattern: str  # one call
    read: Callable[[re.Match[str], dict[str, Tool]], Call]
    rules: Callable[[list[Tool], bool], str]  # GBNF forcing at least one call

    def held_from(self, text: str) -> int:
        """Where the calls may begin in `text` so far (the content stream stops there; -1: nowhere)."""
        if self.opener:
            return text.find(self.opener)
        head = text.lstrip()  # (llama3: a call is the whole answer, a JSON object)
        return 0 if not head or head[0] in "{<" else -1

    def parse(self, text: str, tools: list[Tool]) -> tuple[str, list[Call]]:
        """(the content before the calls, the calls); no call: the text as it is."""
        by_name = {t["function"]["name"]: t for t in tools}
        start = self.held_from(text)
        if start < 0:
            return text, []
        calls = []
        for m in re.finditer(self.pattern, text[start:], re.S):
            try:
                calls.append(self.read(m, by_name))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue  # (a malformed call is left out, as llama.cpp's parser leaves it)
        return (text[:start].rstrip(), calls) if calls else (text, [])


def _read_hermes(m: re.Match[str], tools: dict[str, Tool]) -> Call:
    doc = json.loads(m.group(1))
    return _call(doc["name"], doc.get("arguments", doc.get("parameters", {})))


def _read_qwen3(m: re.Match[str], tools: dict[str, Tool]) -> Call:
    name = m.group(1).strip()
    args = {
        k.strip(): _value(v, tools.get(name), k.strip())
        for k, v in re.findall(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", m.group(2), re.S)
    }
    return _call(name, args)


def _read_glm(m: re.Match[str], tools: dict[str, Tool]) -> Call:
    name = m.group(1).strip()
    pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", m.group(2), re.S)
    return _call(name, {k.strip(): _value(v, tools.get(name), k.strip()) for k, v in pairs})


def _read_deepseek(m: re.Match[str], tools: dict[str, Tool]) -> Call:
    if m.group(1) is not None:  # (V3: function<sep>NAME ```json ARGS ```)
        return _call(m.group(1), json.loads(m.group(2)))
    return _call(m.group(3), json.loads(m.group(4)))


def _read_gemma4(m: re.Match[str], tools: dict[str, Tool]) -> Call:
    return _call(m.group(1), _Gemma(m.group(2)).value())


class _Gemma:
    """Gemma 4's argument syntax: {key:value,..}, strings between <|"|> marks, JSON's numbers,
    booleans and null (llama.cpp's gemma4_to_json)."""

    QUOTE = '<|"|>'

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def _ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def value(self) -> Any:
        self._ws()
        s = self.s
        if s.startswith(self.QUOTE, self.i):
            end = s.index(self.QUOTE, self.i + len(self.QUOTE))
            out, self.i = s[self.i + len(self.QUOTE) : end], end + len(self.QUOTE)
            return out
        if s[self.i] in "{[":
            close, self.i = "}" if s[self.i] == "{" else "]", self.i + 1
            items: list[Any] = []
            while True:
                self._ws()
                if s[self.i] == close:
                    self.i += 1
                    return dict(items) if close == "}" else items
                if close == "}":
                    colon = s.index(":", self.i)
                    key, self.i = s[self.i : colon].strip(), colon + 1
                    items.append((key, self.value()))
                else:
                    items.append(self.value())
                self._ws()
                if s[self.i] == ",":
                    self.i += 1
        m = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null").match(s, self.i)
        if not m:
            raise json.JSONDecodeError("not a Gemma 4 value", s, self.i)
        self.i = m.end()
        return json.loads(m.group(0))


def _read_llama3(m: re.Match[str], tools: dict[str, Tool]) -> Call:
    doc = json.loads(m.group(1))
    return _call(doc["name"], doc.get("parameters", doc.get("arguments", {})))


FORMATS = {
    "hermes": ToolFormat(
        "hermes", "<tool_call>", r"<tool_call>\s*(\{.*?\})\s*</tool_call>", _read_hermes, hermes_rules
    ),
    "qwen3-coder": ToolFormat(
        "qwen3-coder",
        "<tool_call>",
        r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>",
        _read_qwen3,
        qwen3_rules,
    ),
    "glm": ToolFormat("glm", "<tool_call>", r"<tool_call>([^\n<]+)(.*?)</tool_call>", _read_glm, glm_rules),
    "deepseek": ToolFormat(
        "deepseek",
        DS[0],
        re.escape(DS[1])
        + r"(?:function"
        + re.escape(DS[2])
        + r"(\S+)\n```json\n(.*?)\n```|([^<]+?)"
        + re.escape(DS[2])
        + r"(.*?))"
        + re.escape(DS[3]),
        _read_deepseek,
        deepseek_rules,
    ),
    "gemma4": ToolFormat(
        "gemma4", "<|tool_call>", r"<\|tool_call>call:([^{]+)(\{.*?\})<tool_call\|>", _read_gemma4, gemma4_rules
    ),
    "llama3": ToolFormat("llama3", "", r"^\s*(?:<\|python_tag\|>)?\s*(\{.*\})\s*$", _read_llama3, llama3_rules),
}
FORMATS["generic"] = FORMATS["hermes"]


def format_of(template: str, knows_tools: bool) -> ToolFormat:
    """The tool-call format a chat template uses (llama.cpp's detection order)."""
    if not knows_tools:
        return FORMATS["generic"]
    if "'<|tool_call>call:'" in template:
        return FORMATS["gemma4"]
    if "<tool_call>" in template and "<function=" in template and "<parameter=" in template:
        return FORMATS["qwen3-coder"]
    if "<arg_key>" in template and "<tool_call>" in template:
        return FORMATS["glm"]
    if "tool▁calls▁begin" in template:
        return FORMATS["deepseek"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    return FORMATS["llama3"]


GENERIC_HINT = (
    "You can call these tools. To call one, answer with nothing but\n"
    '<tool_call>\n{{"name": "<tool name>", "arguments": {{<its arguments as JSON>}}}}\n</tool_call>\n'
    "Tools (JSON schemas):\n{tools}"
)


def generic_messages(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    """For a template that knows no tools: the tools described in the system message, and earlier
    calls written into their assistant messages in the form the description asks for."""
    hint = GENERIC_HINT.format(tools=json.dumps(tools, ensure_ascii=False))
    out = [dict(m) for m in messages]
    for m in out:
        calls = m.pop("tool_calls", None)
        if calls:
            written = "\n".join(
                "<tool_call>\n"
                + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                + "\n</tool_call>"
                for c in calls
            )
            m["content"] = (m.get("content") or "") + written
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{hint}"}
    else:
        out.insert(0, {"role": "system", "content": hint})
    return out


@dataclass(frozen=True)
class ToolPlan:
    """One request's tools: their format, and those a call is forced among (required: all; a named
    function: it; auto: none forced)."""

    tools: list[Tool]
    fmt: ToolFormat
    forced: Optional[list[Tool]]
    parallel: bool

    def grammar(self) -> Optional[str]:
        """The forced call's grammar (None: no call forced); ConfigError naming a tool whose
        parameters llama.cpp's JSON schema converter cannot take, and why."""
        if not self.forced:
            return None
        for i, t in enumerate(self.tools):
            if t in self.forced:
                try:
                    schemas.grammar(params(t))
                except schemas.SchemaError as e:
                    raise e.under(f"tools.{i}.function.parameters", f" ({t['function']['name']})") from None
        try:
            return self.fmt.rules(self.forced, self.parallel)
        except (ValueError, schemas.SchemaError) as e:
            raise ConfigError(f"`tools`: {e}") from None


def plan(tools: list[Any], choice: Any, parallel: Optional[bool], fmt: ToolFormat) -> Optional[ToolPlan]:
    """The request's tools and tool_choice as a plan (None: no tools, or tool_choice "none");
    ConfigError naming what is malformed."""
    checked: list[Tool] = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(f, dict)):
            raise ConfigError(f'`tools.{i}` must be {{"type": "function", "function": {{"name": ..}}}}')
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise ConfigError(f"`tools.{i}.function.name` is required")
        checked.append({"type": "function", "function": f})
    if not checked or choice == "none":
        return None
    if choice in (None, "auto"):
        return ToolPlan(checked, fmt, None, parallel is not False)
    if choice == "required":
        return ToolPlan(checked, fmt, checked, parallel is not False)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    named = [t for t in checked if t["function"]["name"] == name]
    if not named:
        raise ConfigError(f"`tool_choice` names no tool of `tools`: {choice!r}")
    return ToolPlan(checked, fmt, named, False)


__all__ = ["Call", "Tool", "ToolFormat", "ToolPlan", "FORMATS", "format_of", "generic_messages", "plan"]
