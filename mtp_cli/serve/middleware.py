"""The app's pure-ASGI layers (a BaseHTTPMiddleware would hide a client's disconnect): every POST
body read as JSON, CORS as llama-server answers it, and header names written in their usual case."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response

LOCALHOST = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
METHODS = ("GET", "POST", "DELETE", "OPTIONS")


class JsonBodies:
    """Read every POST body as JSON, whatever its Content-Type says (curl -d sends a form type;
    llama-server reads JSON all the same)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class Cors(CORSMiddleware):
    """Starlette's CORS with llama-server's answer to a preflight from an origin it does not allow:
    200 without Access-Control-Allow-Origin (the browser refuses the call all the same), not a 400."""

    def __init__(self, app: Any, cors_origins: str):
        origins = [o.strip() for o in cors_origins.split(",") if o.strip()]
        local = origins == ["localhost"]
        super().__init__(
            app,
            allow_origins=[] if local else origins,
            allow_origin_regex=LOCALHOST if local else None,
            allow_methods=list(METHODS),
            allow_headers=["*"],  # (the requested ones reflected: a literal * never covers Authorization)
            allow_credentials=True,  # (the allowed origin reflected, as llama-server does: no cookies are read)
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        if not self.is_allowed_origin(request_headers["origin"]):
            return PlainTextResponse("OK", status_code=200, headers={"Vary": "Origin"})
        return super().preflight_response(request_headers)


class HeaderCase:
    """Write response header names as most servers do (Content-Type, Access-Control-Allow-Origin):
    names are case-insensitive, but Starlette lowers them and some clients look them up in a plain
    dict (llama.cpp's own server tests do)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def cased(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(title(k), v) for k, v in message.get("headers", ())]}
            await send(message)

        await self.app(scope, receive, cased)


def title(name: bytes) -> bytes:
    """b"access-control-allow-origin" -> b"Access-Control-Allow-Origin"."""
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


__all__ = ["JsonBodies", "Cors", "HeaderCase", "LOCALHOST", "title"]
