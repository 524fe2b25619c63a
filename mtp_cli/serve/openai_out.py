"""/v1/chat/completions and /v1/completions answered as OpenAI answers them: one body with every
choice, or SSE chunks (each carrying its choice's index); usage once, `mtp` and llama-server's
`timings` beside it (the first choice's)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Optional

from fastapi.responses import JSONResponse, StreamingResponse

from mtp_cli import __version__
from mtp_cli.serve.engine import now
from mtp_cli.serve.events import Delta, Done, Failed, Progress, Started, TokenProb
from mtp_cli.serve.reasoning import ThinkSplit, split
from mtp_cli.serve.replies import GONE, error, failed
from mtp_cli.serve.runs import Run
from mtp_cli.serve.tools import Call

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
FINGERPRINT = f"mtp-cli-{__version__}"  # (OpenAI's system_fingerprint: what served the request)


async def respond(run: Run, obj: str, stream: bool, include_usage: bool) -> Any:
    """The response to a chat ("chat.completion") or text ("text_completion") completion run."""
    first = await run.begin()
    if first is None:
        return error(GONE, "client closed the request")
    if isinstance(first, Failed):
        return failed(first)
    head = {"id": ("chatcmpl-" if obj == "chat.completion" else "cmpl-") + run.id, "created": now()}
    head["model"] = run.engine.alias
    head["system_fingerprint"] = FINGERPRINT
    asked = run.jobs[0].request
    think = getattr(asked, "reasoning_format", None) or run.engine.reasoning_format
    think = think if obj == "chat.completion" else "none"  # (a text completion is the text as written)
    if stream:
        run.streaming()
        return StreamingResponse(
            _sse(run, head, obj, first, include_usage, think), media_type="text/event-stream", headers=SSE_HEADERS
        )
    try:
        done = await run.whole()
    finally:
        run.close()
    if done is None:
        return error(GONE, "client closed the request")
    if isinstance(done, Failed):
        return failed(done)
    return _whole(head, obj, first, done, think)


def usage(first: Started, done: Sequence[Done]) -> dict[str, Any]:
    n = sum(d.stats.n_tokens for d in done)
    return {
        "prompt_tokens": first.n_prompt,
        "completion_tokens": n,
        "total_tokens": first.n_prompt + n,
        "prompt_tokens_details": {"cached_tokens": first.n_cached},
    }


def _logprobs(obj: str, probs: Optional[Sequence[TokenProb]], offset: int = 0) -> Optional[dict[str, Any]]:
    """The choice's `logprobs` as the endpoint spells them (None: not asked)."""
    if probs is None:
        return None
    if obj == "chat.completion":

        def entry(text: str, raw: bytes, lp: float) -> dict[str, Any]:
            return {"token": text, "logprob": lp, "bytes": list(raw)}

        content = [{**entry(p.text, p.raw, p.logprob), "top_logprobs": [entry(*t) for t in p.top]} for p in probs]
        return {"content": content, "refusal": None}
    offsets = []
    for p in probs:
        offsets.append(offset)
        offset += len(p.text)
    return {
        "tokens": [p.text for p in probs],
        "token_logprobs": [p.logprob for p in probs],
        "top_logprobs": [{t[0]: t[2] for t in p.top} for p in probs],
        "text_offset": offsets,
    }


def _choice(
    obj: str,
    index: int,
    text: Optional[str],
    finish: Optional[str],
    *,
    delta: bool,
    role: bool = False,
    logprobs: Optional[dict[str, Any]] = None,
    calls: Sequence[Call] = (),
    reasoning: str = "",
) -> dict:
    if obj == "chat.completion":
        if delta:
            d: dict[str, Any] = {"role": "assistant"} if role else {}
            if reasoning:  # (llama-server's field for a thinking model's reasoning)
                d["reasoning_content"] = reasoning
            if text is not None and not (reasoning and not text):
                d["content"] = text
            if calls:
                d["tool_calls"] = [{"index": i, **call_doc(c)} for i, c in enumerate(calls)]
            return {"index": index, "delta": d, "logprobs": logprobs, "finish_reason": finish}
        message: dict[str, Any] = {"role": "assistant", "content": text or None if calls else text, "refusal": None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [call_doc(c) for c in calls]
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}


def call_doc(c: Call) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _whole(head: dict[str, Any], obj: str, first: Started, done: list[Done], think: str) -> dict[str, Any]:
    choices = []
    for i, d in enumerate(done):
        reasoning, text = split(d.text, think, first.thinking)
        lps = _logprobs(obj, d.probs)
        choices.append(
            _choice(obj, i, text, d.finish_reason, delta=False, logprobs=lps, calls=d.tool_calls, reasoning=reasoning)
        )
    body = {
        **head,
        "object": obj,
        "choices": choices,
        "usage": usage(first, done),
        "mtp": done[0].mtp,
        "timings": done[0].timings,
    }
    if first.prompt_text is not None:  # (llama-server's `verbose`: what the model was given, as text)
        d = done[0]
        said = {"prompt": first.prompt_text, "content": d.text, "tokens_evaluated": first.n_prompt}
        body["__verbose"] = {**said, "tokens_cached": first.n_cached, "tokens_predicted": d.stats.n_tokens}
    return body


async def _sse(
    run: Run, head: dict[str, Any], obj: str, first: Started, include_usage: bool, think: str
) -> AsyncIterator[str]:
    """The stream's chunks as OpenAI sends them; usage and mtp come with the last finish_reason, or
    (include_usage) in a last chunk of their own. A thinking model's reasoning comes as
    `reasoning_content` deltas (`think`: the reasoning format)."""
    kind = obj + ".chunk" if obj == "chat.completion" else obj

    def chunk(choices: list[dict], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'object': kind, 'choices': choices, **extra})}\n\n"

    n = len(run.jobs)
    offsets, done = [0] * n, dict[int, Done]()
    splits = [ThinkSplit(think, first.thinking) for _ in range(n)]
    asked = run.jobs[0].request
    pieces, timed = bool(asked.mtp_pieces), bool(asked.timings_per_token)
    try:
        if obj == "chat.completion":
            for i in range(n):
                yield chunk([_choice(obj, i, "", None, delta=True, role=True)])
        while len(done) < n:
            i, ev = await run.next()
            if isinstance(ev, Delta):
                lps = _logprobs(obj, ev.probs, offsets[i]) if ev.probs else None
                offsets[i] += sum(len(p.text) for p in ev.probs)  # (the tokens' own texts: held-back text included)
                extra: dict[str, Any] = {"mtp_pieces": [[p[1], p[2]] for p in ev.pieces]} if pieces else {}
                if ev.timings is not None:  # (llama-server's timings_per_token)
                    extra["timings"] = ev.timings
                reasoning, text = splits[i].feed(ev.text)
                yield chunk([_choice(obj, i, text, None, delta=True, logprobs=lps, reasoning=reasoning)], **extra)
            elif isinstance(ev, Progress):  # (llama-server's return_progress)
                yield chunk([], prompt_progress=ev.doc(), **({"timings": ev.timings()} if timed else {}))
            elif isinstance(ev, Done):
                done[i] = ev
                reasoning, text = splits[i].close()
                if reasoning or text:  # (what was held back: it could have begun a tag)
                    yield chunk([_choice(obj, i, text, None, delta=True, reasoning=reasoning)])
                if ev.tool_calls:  # (each call whole, in one delta: clients join deltas by index)
                    yield chunk([_choice(obj, i, None, None, delta=True, calls=ev.tool_calls)])
                finish = [_choice(obj, i, None, ev.finish_reason, delta=True)]
                if len(done) < n:
                    yield chunk(finish)
                    continue
                ended = [done[k] for k in range(n)]
                figures = {"usage": usage(first, ended), "mtp": ended[0].mtp, "timings": ended[0].timings}
                if include_usage:  # (as OpenAI: usage once, in a last chunk without choices)
                    yield chunk(finish)
                    yield chunk([], **figures)
                else:
                    yield chunk(finish, **figures)
            elif isinstance(ev, Failed) or ev is None:  # (None: the client left before the stream began)
                body = failed(ev) if ev is not None else error(GONE, "client closed the request")
                yield f"data: {json.dumps(json.loads(bytes(body.body)))}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        run.close()  # (a client gone mid-stream: the jobs stop at their next token)


def json_body(resp: JSONResponse) -> Any:
    return json.loads(bytes(resp.body))


__all__ = ["respond", "usage", "call_doc", "SSE_HEADERS", "json_body"]
