"""The FastAPI app: OpenAI's /v1/models, /v1/chat/completions and /v1/completions (also without
/v1, as llama-server serves them), /health, and OpenAI-style JSON errors for everything refused.

Each completion is a Job on the engine's queue; its events come back through an asyncio queue. The
HTTP status waits for the job to start (a refused prompt is a 400, not a broken stream). A client
that disconnects (a stream closed, or a plain request abandoned) cancels its job at the next token.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any, Optional, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from mtp_cli.errors import MtpError
from mtp_cli.serve.engine import ContextLengthError, Engine, Job, model_info, now
from mtp_cli.serve.events import Delta, Done, Event, Failed, Started, TokenProb
from mtp_cli.serve.requests import ChatRequest, CompletionRequest, request_name
from mtp_cli.serve.tools import Call


def error(
    status: int, message: str, *, code: Optional[str] = None, param: Optional[str] = None, headers: Any = None
) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"  # (OpenAI's two types)
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    """One line for pydantic's first complaint, naming the field as the request spelled it."""
    e = exc.errors()[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    field = ".".join(loc) or None
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    if e.get("type") == "extra_forbidden":
        return f"unsupported parameter `{field}`", field
    if e.get("type") == "missing":
        if field is None:
            return "the request body is empty: send a JSON object", None
        return f"`{field}` is required", field
    if field is None:
        return f"the request body must be a JSON object ({e.get('msg')})", None
    return f"`{field}`: {e.get('msg')}", field


LOCALHOST = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


class JsonBodies:
    """Read every POST body as JSON, whatever its Content-Type says (curl -d sends a form type;
    llama-server reads JSON all the same). Pure ASGI: a client's disconnect still shows."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def create_app(engine: Engine, api_key: Optional[str] = None, cors_origins: str = "*") -> FastAPI:
    """The app; `cors_origins` as llama-server's --cors-origins: "*", "localhost" (a localhost
    Origin only) or a comma-separated list."""
    app = FastAPI(title="mtp-cli", docs_url=None, redoc_url=None, openapi_url=None)
    origins = [o.strip() for o in cors_origins.split(",") if o.strip()]
    local = origins == ["localhost"]
    app.add_middleware(JsonBodies)
    app.add_middleware(  # (pure ASGI, unlike a BaseHTTPMiddleware: a client's disconnect still shows)
        CORSMiddleware,
        allow_origins=[] if local else origins,
        allow_origin_regex=LOCALHOST if local else None,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["*"],
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        msg, field = _validation_message(exc)
        return error(400, msg, param=field)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 401:
            return error(401, str(exc.detail), code="invalid_api_key")
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return error(500, f"internal error: {exc}")

    async def auth(request: Request) -> None:
        """A dependency, not a middleware: Starlette's middleware hides a client's disconnect."""
        if api_key is not None:
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise HTTPException(401, "invalid or missing API key (Authorization: Bearer KEY)")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "queued": engine.queued, "slots": engine.slots}

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_info(engine)]}

    async def chat(req: ChatRequest, request: Request) -> Any:
        return await _complete(engine, req, request, "chat.completion")

    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await _complete(engine, req, request, "text_completion")

    guarded = [Depends(auth)]
    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/models", models, methods=["GET"], dependencies=guarded)
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"], dependencies=guarded)
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"], dependencies=guarded)
    return app


async def _complete(engine: Engine, req: Union[ChatRequest, CompletionRequest], request: Request, obj: str) -> Any:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Optional[Event]] = asyncio.Queue()
    job = Job(req, lambda ev: _post(loop, events, ev))
    head = {"id": ("chatcmpl-" if obj == "chat.completion" else "cmpl-") + job.id[4:], "created": now()}
    head["model"] = engine.alias
    engine.submit(job)
    watcher = asyncio.create_task(_watch(request, job, events))
    try:
        first = await events.get()
        if first is None:
            return error(499, "client closed the request")
        if isinstance(first, Failed):
            return _failed(first)
        assert isinstance(first, Started)
        if req.stream:
            watcher.cancel()  # (from here the streaming response itself notices a client gone)
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _sse(events, job, head, obj, first, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        while True:  # (the deltas are not needed: Done has the whole text)
            ev = await events.get()
            if ev is None:
                return error(499, "client closed the request")
            if isinstance(ev, Failed):
                return _failed(ev)
            if isinstance(ev, Done):
                return _whole(head, obj, first, ev)
    except BaseException:
        job.cancelled.set()
        raise
    finally:
        watcher.cancel()


def _post(loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Optional[Event]], ev: Event) -> None:
    """Hand an event from the worker thread to the request's event loop (gone: nothing to tell)."""
    try:
        loop.call_soon_threadsafe(events.put_nowait, ev)
    except RuntimeError:  # (the loop closed: the server is shutting down)
        pass


async def _watch(request: Request, job: Job, events: asyncio.Queue[Optional[Event]]) -> None:
    """Cancel the job once its client disconnects (the body is read: the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancelled.set()  # (queued: skipped; running: stopped at its next token)
            events.put_nowait(None)
            return


def _failed(f: Failed) -> JSONResponse:
    e = f.error
    if isinstance(e, MtpError):
        code = "context_length_exceeded" if isinstance(e, ContextLengthError) else None
        return error(f.status, e.spelled(lambda name: f"`{request_name(name)}`"), code=code)
    return error(f.status, f"internal error: {e}")


def _usage(first: Started, done: Done) -> dict[str, Any]:
    n = done.stats.n_tokens
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
    text: Optional[str],
    finish: Optional[str],
    *,
    delta: bool,
    role: bool = False,
    logprobs: Optional[dict[str, Any]] = None,
    calls: Sequence[Call] = (),
) -> dict:
    if obj == "chat.completion":
        if delta:
            d: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                d["content"] = text
            if calls:
                d["tool_calls"] = [{"index": i, **_call(c)} for i, c in enumerate(calls)]
            return {"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish}
        message: dict[str, Any] = {"role": "assistant", "content": text or None if calls else text, "refusal": None}
        if calls:
            message["tool_calls"] = [_call(c) for c in calls]
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
    return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}


def _call(c: Call) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _whole(head: dict[str, Any], obj: str, first: Started, done: Done) -> dict[str, Any]:
    lps = _logprobs(obj, done.probs)
    return {
        **head,
        "object": obj,
        "choices": [_choice(obj, done.text, done.finish_reason, delta=False, logprobs=lps, calls=done.tool_calls)],
        "usage": _usage(first, done),
        "mtp": done.mtp,
        "timings": done.timings,
    }


async def _sse(
    events: asyncio.Queue[Optional[Event]],
    job: Job,
    head: dict[str, Any],
    obj: str,
    first: Started,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The stream's chunks as OpenAI sends them; usage and mtp come with finish_reason, or (include_usage)
    in a last chunk of their own."""
    kind = obj + ".chunk" if obj == "chat.completion" else obj

    def chunk(choices: list[dict], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'object': kind, 'choices': choices, **extra})}\n\n"

    offset = 0
    try:
        if obj == "chat.completion":
            yield chunk([_choice(obj, "", None, delta=True, role=True)])
        while True:
            ev = await events.get()
            if isinstance(ev, Delta):
                lps = _logprobs(obj, ev.probs, offset) if ev.probs else None
                offset += sum(len(p.text) for p in ev.probs)  # (the tokens' own texts: held-back text included)
                yield chunk([_choice(obj, ev.text, None, delta=True, logprobs=lps)])
            elif isinstance(ev, Done):
                if ev.tool_calls:  # (each call whole, in one delta: clients join deltas by index)
                    yield chunk([_choice(obj, None, None, delta=True, calls=ev.tool_calls)])
                usage = {"usage": _usage(first, ev), "mtp": ev.mtp, "timings": ev.timings}
                finish = [_choice(obj, None, ev.finish_reason, delta=True)]
                if include_usage:  # (as OpenAI: usage once, in a last chunk without choices)
                    yield chunk(finish)
                    yield chunk([], **usage)
                else:
                    yield chunk(finish, **usage)
                break
            elif isinstance(ev, Failed) or ev is None:  # (None: the client left before the stream began)
                failed = _failed(ev) if ev is not None else error(499, "client closed the request")
                body = json.loads(bytes(failed.body))
                yield f"data: {json.dumps(body)}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # (a client gone mid-stream: the job stops at its next token)


__all__ = ["create_app", "error"]
