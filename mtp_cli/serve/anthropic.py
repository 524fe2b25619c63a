"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens): a request read as a chat
completion (`system`, text / tool_use / tool_result blocks, tools with `input_schema`, tool_choice
auto / any / tool / none, `stop_sequences`), run on the engine like one, answered as a Message with
text and tool_use blocks and a `stop_reason`, streamed as Anthropic's events; errors in
Anthropic's shape."""

from __future__ import annotations

import json
import secrets
from typing import Any, Optional, Union

import pydantic
from fastapi.responses import StreamingResponse
from pydantic import Field

from mtp_cli.errors import ConfigError, MtpError
from mtp_cli.serve.engine import Engine
from mtp_cli.serve.events import Delta, Done, Failed, Started
from mtp_cli.serve.messages import Strict
from mtp_cli.serve.openai_out import SSE_HEADERS
from mtp_cli.serve.reasoning import ThinkSplit, blocks_format, split
from mtp_cli.serve.replies import GONE, anthropic_error, said
from mtp_cli.serve.requests import ChatRequest
from mtp_cli.serve.runs import Run

RENAMED = {"response_format.json_schema.schema": "output_config.format.schema", "stop": "stop_sequences"}
STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class CountRequest(Strict):
    model: Optional[str] = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None


class MessagesRequest(CountRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    stream: Optional[bool] = False
    output_config: Optional[dict[str, Any]] = None  # (its `format`: a JSON schema the answer follows)
    container: Optional[Any] = None
    # bookkeeping fields that change nothing in the output
    metadata: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    cache_control: Optional[dict[str, Any]] = None  # (the prefix cache is always on)
    speed: Optional[str] = None
    inference_geo: Optional[str] = None
    diagnostics: Optional[dict[str, Any]] = None
    user_profile_id: Optional[str] = None
    workspace_id: Optional[str] = None


def chat_request(req: CountRequest) -> ChatRequest:
    """The chat completion the request stands for; ConfigError naming what cannot be honoured."""
    thinking = (req.thinking or {}).get("type")
    if thinking not in (None, "enabled", "disabled", "adaptive"):
        raise ConfigError(f"`thinking.type` takes enabled, adaptive or disabled, got {thinking!r}")
    system = req.system if isinstance(req.system, str) else _texts(req.system or [], "system")
    msgs = [{"role": "system", "content": system}] if system else []
    for i, m in enumerate(req.messages):
        msgs += _message(m, f"messages.{i}")
    body: dict[str, Any] = {"messages": msgs}
    if thinking is not None:  # (as the chat template's enable_thinking: a template without it ignores it)
        body["chat_template_kwargs"] = {"enable_thinking": thinking != "disabled"}
    if isinstance(req, MessagesRequest):
        if req.container is not None:
            raise ConfigError("`container`: this server runs no code-execution container")
        body.update(max_tokens=req.max_tokens, stop=req.stop_sequences or None, temperature=req.temperature)
        body.update(top_p=req.top_p, top_k=req.top_k, response_format=_format(req.output_config))
    if req.tools:
        body["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
        body["tool_choice"], body["parallel_tool_calls"] = _choice(req.tool_choice)
    try:
        return ChatRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise ConfigError(f"`{RENAMED.get(where, where)}`: {first.get('msg')}") from None


def _format(config: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ConfigError("`output_config.format` takes {type: json_schema, schema: {...}}")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _message(m: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool_result blocks become tool messages (first),
    tool_use blocks the assistant's tool_calls."""
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise ConfigError(f"`{where}.role` must be user or assistant, got {role!r}")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ConfigError(f"`{where}.content` must be a string or a list of blocks")
    text, calls, results, thought = [], [], [], []
    for k, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        at = f"{where}.content.{k}"
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            args = json.dumps(b.get("input") or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": str(b.get("id", "")),
                    "type": "function",
                    "function": {"name": str(b.get("name", "")), "arguments": args},
                }
            )
        elif kind == "tool_result" and role == "user":
            body = b.get("content", "")
            said_ = body if isinstance(body, str) else _texts(body or [], f"{at}.content")
            results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": said_})
        elif kind == "thinking" and role == "assistant":  # (the template's reasoning_content, where it has one)
            thought.append(str(b.get("thinking", "")))
        elif kind != "redacted_thinking":  # (encrypted for another model: nothing to read)
            raise ConfigError(f"`{at}`: {kind} blocks are not supported here (text, tool_use, tool_result)")
    out = list(results)
    if text or calls or not results:
        msg: dict[str, Any] = {"role": role, "content": "".join(text)}
        if calls:
            msg["tool_calls"] = calls
        if thought:
            msg["reasoning_content"] = "".join(thought)
        out.append(msg)
    return out


def _texts(blocks: Any, where: str) -> str:
    if not isinstance(blocks, list):
        raise ConfigError(f"`{where}` must be a string or a list of text blocks")
    out = []
    for k, b in enumerate(blocks):
        if not (isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)):
            raise ConfigError(f"`{where}.{k}`: only text blocks are read here")
        out.append(b["text"])
    return "\n".join(out)


def _tool(t: dict[str, Any], i: int) -> dict[str, Any]:
    if t.get("type") not in (None, "custom") or "input_schema" not in t:
        raise ConfigError(
            f"`tools.{i}`: {t.get('type') or 'a tool without input_schema'}: client tools only (name, input_schema)"
        )
    fn = {"name": t.get("name"), "description": t.get("description"), "parameters": t["input_schema"]}
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def _choice(choice: Optional[dict[str, Any]]) -> tuple[Any, Optional[bool]]:
    """(chat's tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, None
    single = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, single
    if kind == "any":
        return "required", single
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, False
    raise ConfigError(f"`tool_choice.type` takes auto, any, tool or none, got {kind!r}")


async def count(engine: Engine, req: CountRequest) -> Any:
    try:
        return {"input_tokens": engine.count(chat_request(req))}
    except MtpError as e:
        return anthropic_error(400, said(Failed(e, 400), RENAMED)[0])


async def respond(engine: Engine, req: MessagesRequest, client: Any) -> Any:
    try:
        chat = chat_request(req)
    except ConfigError as e:
        return anthropic_error(400, said(Failed(e, 400), RENAMED)[0])
    run = Run(engine, [chat], client)
    mid = "msg_" + run.id + secrets.token_hex(6)
    first = await run.begin()
    if first is None:
        return anthropic_error(GONE, "client closed the request")
    if isinstance(first, Failed):
        return anthropic_error(first.status, said(first, RENAMED)[0])
    if req.stream:
        run.streaming()
        return StreamingResponse(
            _events(run, mid, engine.alias, first), media_type="text/event-stream", headers=SSE_HEADERS
        )
    try:
        done = await run.whole()
    finally:
        run.close()
    if done is None:
        return anthropic_error(GONE, "client closed the request")
    if isinstance(done, Failed):
        return anthropic_error(done.status, said(done, RENAMED)[0])
    d = done[0]
    reasoning, content = split(d.text, blocks_format(engine.reasoning_format), first.thinking)
    thought = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
    text = [{"type": "text", "text": content}] if content or not d.tool_calls else []
    return {**_head(mid, engine.alias, first, d), "content": thought + text + _uses(d)}


def _usage(first: Started, n_out: int) -> dict[str, Any]:
    """Anthropic counts cached prompt tokens apart from the input tokens."""
    return {
        "input_tokens": first.n_prompt - first.n_cached,
        "cache_read_input_tokens": first.n_cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": n_out,
    }


def _head(mid: str, model: str, first: Started, d: Optional[Done]) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None
        if d is None
        else "stop_sequence"
        if d.stop_sequence
        else STOP_REASON.get(d.finish_reason, "end_turn"),
        "stop_sequence": None if d is None else d.stop_sequence,
        "usage": _usage(first, 0 if d is None else d.stats.n_tokens),
        **({"mtp": d.mtp} if d is not None else {}),  # (no llama-server `timings`: as llama-server's Messages)
    }


def _uses(d: Done) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)} for c in d.tool_calls]


class _Blocks:
    """The stream's content blocks in order: a thinking block (a thinking model's reasoning), then a
    text block, each opened by its first delta and stopped when the next begins."""

    def __init__(self, event: Any):
        self.event, self.index, self.kind = event, -1, ""

    def delta(self, kind: str, text: str) -> Any:
        if not text:
            return
        if kind != self.kind:
            yield from self.stop()
            self.index, self.kind = self.index + 1, kind
            block = {"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})}
            yield self.event("content_block_start", index=self.index, content_block=block)
        key = "text_delta" if kind == "text" else "thinking_delta"
        yield self.event("content_block_delta", index=self.index, delta={"type": key, kind: text})

    def empty_text(self) -> Any:
        yield from self.stop()
        self.index, self.kind = self.index + 1, "text"
        yield self.event("content_block_start", index=self.index, content_block={"type": "text", "text": ""})

    def stop(self) -> Any:
        if self.kind == "thinking":  # (no signature to give: an empty one, as the block's field)
            delta = {"type": "signature_delta", "signature": ""}
            yield self.event("content_block_delta", index=self.index, delta=delta)
        if self.kind:
            yield self.event("content_block_stop", index=self.index)
        self.kind = ""


async def _events(run: Run, mid: str, model: str, first: Started) -> Any:
    """Anthropic's stream: message_start, a thinking block's and a text block's start / deltas /
    stop, each tool_use block (its input as one JSON delta), message_delta (stop_reason, usage),
    message_stop."""

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    blocks, think = _Blocks(event), ThinkSplit(blocks_format(run.engine.reasoning_format), first.thinking)
    texted = False
    try:
        yield event("message_start", message=_head(mid, model, first, None))
        yield event("ping")
        while True:
            _, ev = await run.next()
            if isinstance(ev, Delta) and ev.text:
                reasoning, text = think.feed(ev.text)
                for e in [*blocks.delta("thinking", reasoning), *blocks.delta("text", text)]:
                    yield e
                texted = texted or bool(text)
            elif isinstance(ev, Done):
                reasoning, text = think.close()
                texted = texted or bool(text)
                for e in [*blocks.delta("thinking", reasoning), *blocks.delta("text", text)]:
                    yield e
                if not texted and not ev.tool_calls:  # (an answer has a text block, empty or not)
                    for e in blocks.empty_text():
                        yield e
                for e in blocks.stop():
                    yield e
                for k, use in enumerate(_uses(ev), start=blocks.index + 1):
                    yield event("content_block_start", index=k, content_block={**use, "input": {}})
                    partial = json.dumps(use["input"], ensure_ascii=False)
                    yield event(
                        "content_block_delta", index=k, delta={"type": "input_json_delta", "partial_json": partial}
                    )
                    yield event("content_block_stop", index=k)
                whole = _head(mid, model, first, ev)
                delta = {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
                yield event("message_delta", delta=delta, usage=whole["usage"], mtp=ev.mtp)
                yield event("message_stop")
                return
            elif isinstance(ev, Failed) or ev is None:
                message = said(ev, RENAMED)[0] if ev is not None else "client closed the request"
                kind = "api_error" if ev is None or ev.status >= 500 else "invalid_request_error"
                yield event("error", error={"type": kind, "message": message})
                return
    finally:
        run.close()


__all__ = ["MessagesRequest", "CountRequest", "respond", "count", "chat_request"]
