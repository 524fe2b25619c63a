"""The FastAPI app: OpenAI's /v1/models, /v1/chat/completions, /v1/completions and /v1/responses,
Anthropic's /v1/messages (also without /v1, as llama-server serves them), /health, and each API's
own JSON errors for everything refused.

Each completion is a Run of Jobs on the engine's queue (mtp_cli.serve.runs); its events come back
through an asyncio queue. The HTTP status waits for the first job to start (a refused prompt is a
400, not a broken stream). A client that disconnects (a stream closed, or a plain request
abandoned) cancels its jobs at the next token.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from mtp_cli.errors import MtpError
from mtp_cli.serve import anthropic, embed, native, openai_out, responses, webui
from mtp_cli.serve.engine import Engine, model_info
from mtp_cli.serve.middleware import Cors, HeaderCase, JsonBodies
from mtp_cli.serve.replies import anthropic_error, error
from mtp_cli.serve.requests import ChatRequest, CompletionRequest
from mtp_cli.serve.runs import Run, choices


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


@dataclass(frozen=True)
class Surface:
    """What the server shows beside the APIs (llama-server's flags): /slots (--no-slots: off), /metrics
    (--metrics), POST /props (--props), the chat page at / (--no-webui: off)."""

    slots: bool = True
    metrics: bool = False
    props: bool = False
    webui: bool = True


def create_app(
    engine: Engine, api_key: Optional[str] = None, cors_origins: str = "*", surface: Surface = Surface()
) -> FastAPI:
    """The app; `cors_origins` as llama-server's --cors-origins: "*", "localhost" (a localhost
    Origin only) or a comma-separated list."""
    app = FastAPI(title="mtp-cli", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(JsonBodies)
    app.add_middleware(Cors, cors_origins=cors_origins)
    app.add_middleware(HeaderCase)  # (outermost: it sees every response, CORS preflights included)
    _errors(app)

    async def auth(request: Request) -> None:
        """A dependency, not a middleware: Starlette's middleware hides a client's disconnect. The key
        as OpenAI's clients send it (Authorization: Bearer) or Anthropic's (x-api-key)."""
        if api_key is not None:  # (Authorization first, as llama-server reads them; headers arrive as latin-1)
            auth = request.headers.get("authorization", "").strip()
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else auth
            given = given or request.headers.get("x-api-key", "")
            if not secrets.compare_digest(given.encode("latin-1", "replace"), api_key.encode()):
                raise HTTPException(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "queued": engine.queued, "slots": engine.slots}

    guarded, routes = [Depends(auth)], _routes(engine)  # (once: one store of responses for both prefixes)
    for prefix in ("/v1", ""):
        for path, route, method in routes:
            if not (prefix == "" and path == "/completions"):  # (llama-server's: the native one)
                app.add_api_route(prefix + path, route, methods=[method], dependencies=guarded)
    for path, route, method in _native(engine, surface):
        app.add_api_route(path, route, methods=[method], dependencies=guarded)
    if surface.webui:
        app.add_api_route("/", webui.page, methods=["GET"], include_in_schema=False)
    return app


def _native(engine: Engine, surface: Surface) -> list[tuple[str, Any, str]]:
    """llama-server's own routes: (path, handler, method)."""

    def off(flag: str) -> JSONResponse:
        return error(501, f"this endpoint is off: start the server with {flag}", code="not_supported")

    async def props() -> Any:
        return native.props(engine, {"slots": surface.slots, "metrics": surface.metrics, "webui": surface.webui})

    async def set_props() -> Any:
        return off("--props") if not surface.props else error(400, "no property can be changed while serving")

    async def slots() -> Any:
        return native.slots(engine) if surface.slots else off("--slots")

    async def metrics() -> Any:
        if not surface.metrics:
            return off("--metrics")
        res = engine.startup
        text = engine.metrics.text(len(engine.slots_busy), engine.queued, res.mode, res.config.spec_type)
        headers = {"Process-Start-Time-Unix": str(engine.metrics.started)}
        return PlainTextResponse(text, headers=headers, media_type="text/plain; version=0.0.4")

    async def tokenize(req: native.TokenizeRequest) -> Any:
        return native.tokenize(engine, req)

    async def detokenize(req: native.DetokenizeRequest) -> Any:
        return native.detokenize(engine, req)

    async def apply_template(req: ChatRequest) -> Any:
        return native.apply_template(engine, req)

    async def completion(req: native.NativeRequest, request: Request) -> Any:
        return await native.complete(engine, req, request)

    return [
        ("/props", props, "GET"),
        ("/props", set_props, "POST"),
        ("/slots", slots, "GET"),
        ("/metrics", metrics, "GET"),
        ("/tokenize", tokenize, "POST"),
        ("/detokenize", detokenize, "POST"),
        ("/apply-template", apply_template, "POST"),
        ("/completion", completion, "POST"),
        ("/completions", completion, "POST"),
    ]


def _refuse(request: Request, status: int, message: str, **kw: Any) -> JSONResponse:
    """An error in the shape of the API the path belongs to."""
    if _anthropic(request):
        return anthropic_error(status, message, headers=kw.get("headers"))
    return error(status, message, **kw)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        msg, field = _validation_message(exc)
        return _refuse(request, 400, msg, param=field)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 401:
            return _refuse(request, 401, str(exc.detail), code="invalid_api_key")
        return _refuse(
            request, exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        return _refuse(request, 500, f"internal error: {exc}")


def _routes(engine: Engine) -> list[tuple[str, Any, str]]:
    """(path under /v1, handler, method) of every guarded route."""

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_info(engine)]}

    async def model(model_id: str) -> dict[str, Any]:
        """Any name is the one model (as a request's `model`): described under the name asked."""
        return {**model_info(engine), "id": model_id}

    async def chat(req: ChatRequest, request: Request) -> Any:
        include = bool(req.stream_options and req.stream_options.include_usage)
        run = Run(engine, choices(req, req.n or 1), request)
        return await openai_out.respond(run, "chat.completion", bool(req.stream), include)

    async def completions(req: CompletionRequest, request: Request) -> Any:
        include = bool(req.stream_options and req.stream_options.include_usage)
        run = Run(engine, choices(req, req.n or 1), request)
        return await openai_out.respond(run, "text_completion", bool(req.stream), include)

    async def embeddings(req: embed.EmbeddingRequest) -> Any:
        return await embed.respond(engine, req)

    async def messages(req: anthropic.MessagesRequest, request: Request) -> Any:
        return await anthropic.respond(engine, req, request)

    async def count_tokens(req: anthropic.CountRequest) -> Any:
        return await anthropic.count(engine, req)

    async def chat_tokens(req: ChatRequest) -> Any:
        """llama-server's input token count of a chat request (its prompt, rendered whole)."""
        try:
            return {"input_tokens": engine.count(req)}
        except MtpError as e:
            return error(400, e.spelled(lambda name: f"`{name}`"))

    return [
        ("/models", models, "GET"),
        ("/models/{model_id:path}", model, "GET"),
        ("/chat/completions", chat, "POST"),
        ("/completions", completions, "POST"),
        ("/embeddings", embeddings, "POST"),
        ("/messages", messages, "POST"),
        ("/messages/count_tokens", count_tokens, "POST"),
        ("/chat/completions/input_tokens", chat_tokens, "POST"),
        *_responses_routes(engine),
    ]


def _responses_routes(engine: Engine) -> list[tuple[str, Any, str]]:
    """The Responses API's routes, over one store of the responses kept."""
    kept = responses.Store()

    async def respond(req: responses.ResponsesRequest, request: Request) -> Any:
        return await responses.respond(engine, kept, req, request)

    async def get_response(response_id: str) -> Any:
        return kept.get(response_id) or error(404, f"no response {response_id!r} is kept", param="response_id")

    async def delete_response(response_id: str) -> Any:
        if kept.pop(response_id) is None:
            return error(404, f"no response {response_id!r} is kept", param="response_id")
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def input_tokens(req: responses.ResponsesRequest) -> Any:
        try:
            before = kept.history(req.previous_response_id) if req.previous_response_id else []
            chat, _ = responses.chat_request(req, before)
            return {"object": "response.input_tokens", "input_tokens": engine.count(chat)}
        except MtpError as e:
            return error(400, e.spelled(lambda name: f"`{name}`"))

    return [
        ("/responses", respond, "POST"),
        ("/responses/input_tokens", input_tokens, "POST"),
        ("/responses/{response_id}", get_response, "GET"),
        ("/responses/{response_id}", delete_response, "DELETE"),
    ]


def _anthropic(request: Request) -> bool:
    return request.url.path.rstrip("/").split("/v1", 1)[-1].startswith("/messages")


__all__ = ["create_app", "error", "Surface"]
