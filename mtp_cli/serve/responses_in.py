"""A Responses API request (pydantic) and the chat completion it stands for: `input` as text or
items (messages, function_call, function_call_output), `instructions` as the system message,
function tools and tool_choice in chat's shapes, `text.format` as response_format, and the kept
conversation of `previous_response_id` in front. Anything it cannot honour is refused by name."""

from __future__ import annotations

import json
from typing import Any, Optional, Union

import pydantic
from pydantic import Field

from mtp_cli.config import MAX_LOGPROBS
from mtp_cli.errors import ConfigError
from mtp_cli.serve.messages import Strict
from mtp_cli.serve.requests import ChatRequest

# chat's field names -> the Responses API's, for errors raised on the chat request it became
RENAMED = {
    "response_format.json_schema.schema": "text.format.schema",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
    "messages": "input",
}
TEXT_PARTS = {"input_text", "output_text", "text"}


class ResponsesRequest(Strict):
    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    include: Optional[list[str]] = None
    stream: Optional[bool] = False
    stream_options: Optional[dict[str, Any]] = None
    store: Optional[bool] = None
    previous_response_id: Optional[str] = None
    truncation: Optional[str] = None
    reasoning: Optional[dict[str, Any]] = None  # (this model does not reason apart: accepted, no effect)
    max_tool_calls: Optional[int] = Field(None, ge=1)
    background: Optional[bool] = None
    # bookkeeping fields that change nothing in the output
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    prompt_cache_retention: Optional[str] = None
    safety_identifier: Optional[str] = None
    timings_per_token: Optional[bool] = None  # (llama-server's: timings in each text delta)
    return_progress: Optional[bool] = None  # (llama-server's: prompt_progress while the prompt is read)
    # llama-server's sampling fields
    seed: Optional[int] = None
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repeat_penalty: Optional[float] = Field(None, gt=0.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """(the chat request, the conversation without instructions: what a follow-up continues)."""
    if req.background:
        raise ConfigError("`background`: responses run in the foreground here")
    if req.truncation not in (None, "disabled", "auto"):
        raise ConfigError(f"`truncation` takes disabled or auto, got {req.truncation!r}")
    said = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else _items(req.input)
    convo = [*history, *said]
    if not convo:
        raise ConfigError("`input` is empty")
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {
        "messages": system + convo,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repeat_penalty": req.repeat_penalty,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "parallel_tool_calls": False if req.max_tool_calls == 1 else req.parallel_tool_calls,
        "response_format": _format(req.text),
        "timings_per_token": req.timings_per_token,
        "return_progress": req.return_progress,
    }
    if req.top_logprobs is not None or "message.output_text.logprobs" in (req.include or []):
        body["logprobs"], body["top_logprobs"] = True, req.top_logprobs or 0
    if req.tools:
        body["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
        body["tool_choice"] = _choice(req.tool_choice)
    try:
        chat = ChatRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise ConfigError(f"`{RENAMED.get(where, where)}`: {first.get('msg')}") from None
    return chat, convo


def _items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: function calls join the assistant message before them."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ConfigError(f"`{where}.role` must be user, assistant, system or developer, got {role!r}")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            fn = {"name": _str(item, "name", where), "arguments": item.get("arguments") or "{}"}
            call = {"id": _str(item, "call_id", where), "type": "function", "function": fn}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _str(item, "call_id", where), "content": text})
        elif kind != "reasoning":  # (a reasoning item sent back: this model has none to read)
            raise ConfigError(
                f"`{where}`: {kind} items are not supported (message, function_call, function_call_output)"
            )
    return out


def _str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"`{where}.{key}` is required")
    return value


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or text parts (input_text, output_text); others refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ConfigError(f"`{where}` must be a string or a list of parts")
    out = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal":
            out.append(str(part.get("refusal", "")))
        else:
            raise ConfigError(f"`{where}.{k}`: {kind} parts are not supported (this model reads text)")
    return "".join(out)


def _tool(t: dict[str, Any], i: int) -> dict[str, Any]:
    if t.get("type") != "function":
        raise ConfigError(f"`tools.{i}`: {t.get('type')} tools are not supported (function tools only)")
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def _choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ConfigError(f"`tool_choice`: {json.dumps(choice)} is not supported (auto, none, required, or a function)")


def _format(text: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if text is not None and not isinstance(text.get("format", {}), dict):
        raise ConfigError("`text.format` must be an object: {type: text | json_object | json_schema, ...}")
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise ConfigError(f"`text.format.type` takes text, json_object or json_schema, got {fmt.get('type')!r}")


__all__ = ["ResponsesRequest", "chat_request", "RENAMED"]
