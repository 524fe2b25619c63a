"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}): a request read
as a chat completion (mtp_cli.serve.responses_in), run on the engine like one, answered as a
Response (output items: a message, function calls), streamed as Responses events; responses kept
in memory for `previous_response_id` while the server lives (`store`, on by default)."""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from typing import Any, Optional

from fastapi.responses import StreamingResponse

from mtp_cli.errors import ConfigError
from mtp_cli.serve.engine import Engine, now
from mtp_cli.serve.events import Delta, Done, Failed, Progress, Started, TokenProb
from mtp_cli.serve.openai_out import SSE_HEADERS
from mtp_cli.serve.reasoning import ThinkSplit, blocks_format, split
from mtp_cli.serve.replies import GONE, error, said
from mtp_cli.serve.responses_in import RENAMED, ResponsesRequest, chat_request
from mtp_cli.serve.runs import Run

MAX_KEPT = 1024  # responses kept for previous_response_id (the oldest goes first)


class Store:
    """Responses kept by id: the Response as sent, and the conversation it ended (chat messages)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def put(self, doc: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self._kept[doc["id"]] = (doc, history)
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)

    def get(self, rid: str) -> Optional[dict[str, Any]]:
        got = self._kept.get(rid)
        return got[0] if got else None

    def history(self, rid: str) -> list[dict[str, Any]]:
        if rid not in self._kept:
            raise ConfigError(
                f"`previous_response_id`: no response {rid!r} is kept (stored responses last while the server runs)"
            )
        return self._kept[rid][1]

    def pop(self, rid: str) -> Optional[dict[str, Any]]:
        got = self._kept.pop(rid, None)
        return got[0] if got else None


async def respond(engine: Engine, store: Store, req: ResponsesRequest, client: Any) -> Any:
    try:
        chat, history = chat_request(req, store.history(req.previous_response_id) if req.previous_response_id else [])
    except ConfigError as e:
        return error(400, said(Failed(e, 400), RENAMED)[0])
    run = Run(engine, [chat], client)
    rid = "resp_" + run.id + secrets.token_hex(6)
    head = _head(req, rid, engine.alias)
    first = await run.begin()
    if first is None:
        return error(GONE, "client closed the request")
    if isinstance(first, Failed):
        text, code = said(first, RENAMED)
        return error(first.status, text, code=code)
    if req.stream:
        run.streaming()
        keep = store if req.store is not False else None
        events = _events(run, head, first, keep, history)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        done = await run.whole()
    finally:
        run.close()
    if done is None:
        return error(GONE, "client closed the request")
    if isinstance(done, Failed):
        text, code = said(done, RENAMED)
        return error(done.status, text, code=code)
    doc = _finished(head, first, done[0], blocks_format(engine.reasoning_format))
    _keep(store if req.store is not False else None, doc, history, done[0])
    return doc


def _head(req: ResponsesRequest, rid: str, model: str) -> dict[str, Any]:
    """The Response's fields that echo the request."""
    return {
        "id": rid,
        "object": "response",
        "created_at": now(),
        "status": "in_progress",
        "model": model,
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "text": req.text or {"format": {"type": "text"}},
        "truncation": req.truncation or "disabled",
        "metadata": req.metadata or {},
        "store": req.store is not False,
        "user": req.user,
        "usage": None,
    }


def _message(mid: str, text: str, probs: Optional[tuple[TokenProb, ...]], status: str = "completed") -> dict[str, Any]:
    return {"id": mid, "type": "message", "status": status, "role": "assistant", "content": [_text_part(text, probs)]}


def _text_part(text: str, probs: Optional[tuple[TokenProb, ...]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": _logprobs(probs)}


def _logprobs(probs: Optional[tuple[TokenProb, ...]]) -> list[dict[str, Any]]:
    def entry(text: str, raw: bytes, lp: float) -> dict[str, Any]:
        return {"token": text, "logprob": lp, "bytes": list(raw)}

    return [{**entry(p.text, p.raw, p.logprob), "top_logprobs": [entry(*t) for t in p.top]} for p in probs or ()]


def _calls(done: Done) -> list[dict[str, Any]]:
    return [
        {
            "id": "fc_" + c.id[5:],
            "type": "function_call",
            "status": "completed",
            "call_id": c.id,
            "name": c.name,
            "arguments": c.arguments,
        }
        for c in done.tool_calls
    ]


def _reasoning(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A thinking model's reasoning as an output item (its text whole: there is no summary to give)."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": rid, "type": "reasoning", "summary": [], "content": content, "status": status}


def _finished(
    head: dict[str, Any], first: Started, done: Done, think: str, mid: Optional[str] = None, rid: Optional[str] = None
) -> dict[str, Any]:
    """The whole Response once the generation ended (a message and reasoning streamed, `mid` and
    `rid`, stay in it; `think`: the reasoning format)."""
    reasoning, text = split(done.text, think, first.thinking)
    output = [_reasoning(rid or "rs_" + secrets.token_hex(12), reasoning)] if reasoning or rid else []
    if text or not done.tool_calls or mid is not None:
        output.append(_message(mid or "msg_" + secrets.token_hex(12), text, done.probs))
    output += _calls(done)
    cut = done.finish_reason == "length"
    usage = {
        "input_tokens": first.n_prompt,
        "input_tokens_details": {"cached_tokens": first.n_cached},
        "output_tokens": done.stats.n_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": first.n_prompt + done.stats.n_tokens,
    }
    return {
        **head,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "usage": usage,
        "mtp": done.mtp,
        "timings": done.timings,
    }


def _keep(store: Optional[Store], doc: dict[str, Any], history: list[dict[str, Any]], done: Done) -> None:
    """The response and the conversation it ended, kept for a follow-up (store None: not kept)."""
    if store is None:
        return
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in done.tool_calls
    ]
    said = {o["type"]: o for o in doc["output"]}
    text = said["message"]["content"][0]["text"] if "message" in said else ""
    answer: dict[str, Any] = {"role": "assistant", "content": text}
    if "reasoning" in said and said["reasoning"]["content"]:
        answer["reasoning_content"] = said["reasoning"]["content"][0]["text"]
    if calls:
        answer["tool_calls"] = calls
    store.put(doc, [*history, answer])


class _Said:
    """Responses events as SSE, numbered in order (`sequence_number`)."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.seq - 1, **fields})}\n\n"

    def items(self, output: list[dict[str, Any]], start: int) -> list[str]:
        """The output items from `start` on, each whole (a function call's arguments in one delta)."""
        out = []
        for k, item in enumerate(output[start:], start=start):
            if item["type"] == "message":  # (no text streamed, but a message: say it whole)
                out += [self("response.output_item.added", output_index=k, item=item)]
                out += [self("response.output_item.done", output_index=k, item=item)]
                continue
            at = {"item_id": item["id"], "output_index": k}
            pending = {**item, "arguments": "", "status": "in_progress"}
            out += [self("response.output_item.added", output_index=k, item=pending)]
            out += [self("response.function_call_arguments.delta", **at, delta=item["arguments"])]
            out += [self("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])]
            out += [self("response.output_item.done", output_index=k, item=item)]
        return out


async def _events(
    run: Run, head: dict[str, Any], first: Started, store: Optional[Store], history: list[dict[str, Any]]
) -> Any:
    """The Responses event stream: created, in_progress, a thinking model's reasoning item and its
    text deltas, the message's item, part and text deltas, each function call's item and arguments,
    then completed (or incomplete); an error event if it fails."""
    event, think = _Said(), ThinkSplit(blocks_format(run.engine.reasoning_format), first.thinking)
    out = _Streamed(event)
    try:
        yield event("response.created", response=head)
        yield event("response.in_progress", response=head)
        while True:
            _, ev = await run.next()
            if isinstance(ev, Delta) and ev.text:
                reasoning, text = think.feed(ev.text)
                live = {"timings": ev.timings} if ev.timings is not None else {}
                for e in [*out.reasoning(reasoning), *out.text(text, ev.probs, live)]:
                    yield e
            elif isinstance(ev, Progress):
                yield event("response.in_progress", response=head, prompt_progress=ev.doc())
            elif isinstance(ev, Done):
                reasoning, text = think.close()
                for e in [*out.reasoning(reasoning), *out.text(text, (), {})]:
                    yield e
                doc = _finished(head, first, ev, blocks_format(run.engine.reasoning_format), out.mid, out.rid)
                for e in out.done(doc["output"]):
                    yield e
                for said_ in event.items(doc["output"], out.opened):
                    yield said_
                _keep(store, doc, history, ev)
                yield event(f"response.{doc['status']}", response=doc, timings=ev.timings)
                return
            elif isinstance(ev, Failed) or ev is None:
                message, code = said(ev, RENAMED) if ev is not None else ("client closed the request", None)
                code = code or ("server_error" if ev is None or ev.status >= 500 else "invalid_request")
                yield event("error", code=code, message=message, param=None)
                return
    finally:
        run.close()


class _Streamed:
    """The stream's reasoning item (first, when the model thinks) and message item, each added with
    its first delta, the reasoning ended before the message begins; `done` ends what is still open
    with the whole Response's own items."""

    def __init__(self, event: _Said):
        self.event = event
        self.rid: Optional[str] = None
        self.mid: Optional[str] = None
        self.thought = ""
        self.opened = 0  # (output items begun: the rest are said whole after)
        self.ended = 0  # (of those, the ones already done)

    def reasoning(self, text: str) -> list[str]:
        if not text:
            return []
        out = []
        if self.rid is None:
            self.rid, self.opened = "rs_" + secrets.token_hex(12), self.opened + 1
            item = _reasoning(self.rid, "", "in_progress")
            out.append(self.event("response.output_item.added", output_index=0, item=item))
        self.thought += text
        at = {"item_id": self.rid, "output_index": 0, "content_index": 0}
        return [*out, self.event("response.reasoning_text.delta", **at, delta=text)]

    def text(self, text: str, probs: Any, live: dict[str, Any]) -> list[str]:
        if not text:
            return []
        out = []
        if self.mid is None:
            if self.rid is not None:  # (as OpenAI streams: an item is done before the next is added)
                out += self._end(_reasoning(self.rid, self.thought), 0)
            self.mid, self.opened = "msg_" + secrets.token_hex(12), self.opened + 1
            item = {**_message(self.mid, "", None, "in_progress"), "content": []}
            out.append(self.event("response.output_item.added", output_index=self.opened - 1, item=item))
            at = {"item_id": self.mid, "output_index": self.opened - 1, "content_index": 0}
            out.append(self.event("response.content_part.added", **at, part=_text_part("", None)))
        at = {"item_id": self.mid, "output_index": self.opened - 1, "content_index": 0}
        delta = self.event("response.output_text.delta", **at, delta=text, logprobs=_logprobs(probs), **live)
        return [*out, delta]

    def done(self, output: list[dict[str, Any]]) -> list[str]:
        out: list[str] = []
        for k in range(self.ended, self.opened):
            out += self._end(output[k], k)
        return out

    def _end(self, item: dict[str, Any], k: int) -> list[str]:
        at = {"item_id": item["id"], "output_index": k, "content_index": 0}
        self.ended = k + 1
        if item["type"] == "reasoning":
            text = item["content"][0]["text"] if item["content"] else ""
            said = [self.event("response.reasoning_text.done", **at, text=text)]
        else:
            part = item["content"][0]
            said = [self.event("response.output_text.done", **at, text=part["text"], logprobs=part["logprobs"])]
            said.append(self.event("response.content_part.done", **at, part=part))
        return [*said, self.event("response.output_item.done", output_index=k, item=item)]


__all__ = ["Store", "respond", "chat_request", "ResponsesRequest"]
