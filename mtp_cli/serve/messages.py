"""Chat messages as OpenAI's clients send them (pydantic), and as a chat template takes them.

Every field of the current schema is accepted, `null` included, so a history built from a returned
`message.model_dump()` (refusal, audio, function_call, tool_calls, annotations all null) goes back
as it came; a part the model cannot read (an image, audio, a file) is refused by name.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict

from mtp_cli.errors import ConfigError


class Strict(BaseModel):
    """Unknown fields are refused by name (a misspelt field is not silently dropped)."""

    model_config = ConfigDict(extra="forbid")


class TextPart(BaseModel):
    """A part's other keys (Anthropic-style `cache_control`, say) are ignored, as OpenAI ignores them."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class RefusalPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["refusal"]
    refusal: str


class OtherPart(BaseModel):
    """An image, audio or file part: parsed only to be refused by name."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url", "input_audio", "file", "input_image", "input_file"]


Part = Union[TextPart, RefusalPart, OtherPart]


class FunctionCall(Strict):
    name: str
    arguments: str = "{}"


class ToolCall(Strict):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall
    index: Optional[int] = None  # (a streamed delta's, when a client keeps it)


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[Part], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    refusal: Optional[str] = None
    reasoning_content: Optional[str] = None  # (llama-server's and DeepSeek's)
    # in a returned message, null or empty; accepted as they come back
    function_call: Optional[FunctionCall] = None
    audio: Optional[dict[str, Any]] = None
    annotations: Optional[list[Any]] = None

    def text(self, where: str) -> str:
        if not isinstance(self.content, list):
            return self.content or ""
        out = []
        for i, p in enumerate(self.content):
            if isinstance(p, OtherPart):
                raise ConfigError(f"`{where}.content.{i}`: {p.type} parts are not supported (this model reads text)")
            out.append(p.text if isinstance(p, TextPart) else p.refusal)
        return "".join(out)

    def for_template(self, where: str) -> dict[str, Any]:
        """The message as chat templates take it: its text, "developer" as "system", the legacy
        "function" role as "tool", tool calls with their arguments as objects (as templates
        render them with tojson)."""
        role = {"developer": "system", "function": "tool"}.get(self.role, self.role)
        out: dict[str, Any] = {"role": role, "content": self.text(where)}
        calls = self.tool_calls or ([ToolCall(function=self.function_call)] if self.function_call else [])
        if calls:
            out["tool_calls"] = [_call(c) for c in calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and role == "tool":
            out["name"] = self.name
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        return out


def _call(c: ToolCall) -> dict[str, Any]:
    try:
        args: Any = json.loads(c.function.arguments) if c.function.arguments.strip() else {}
    except json.JSONDecodeError:
        args = c.function.arguments  # (the model's own malformed call, sent back as it was)
    return {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}}


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.for_template(f"messages.{i}") for i, m in enumerate(messages)]


def lone_surrogate(value: Any, where: str = "") -> Optional[str]:
    """The first field (dotted path) whose text holds a lone surrogate ("\\ud800" is valid JSON but
    no text: it cannot be tokenized), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "the body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = lone_surrogate(v, f"{where}.{k}" if where else str(k))
        if found:
            return found
    return None


__all__ = ["Message", "ToolCall", "FunctionCall", "TextPart", "Strict", "template_messages", "lone_surrogate"]
