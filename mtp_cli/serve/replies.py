"""Errors as each API spells them: OpenAI's `{"error": {...}}` (chat, completions, Responses) and
Anthropic's `{"type": "error", "error": {...}}` (Messages); a job's Failed said in one line, naming
the request's own fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from fastapi.responses import JSONResponse

from mtp_cli.errors import MtpError
from mtp_cli.serve.engine import ContextLengthError
from mtp_cli.serve.events import Failed
from mtp_cli.serve.requests import request_name

ANTHROPIC_KIND = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    503: "overloaded_error",
}


def error(
    status: int, message: str, *, code: Optional[str] = None, param: Optional[str] = None, headers: Any = None
) -> JSONResponse:
    kind = "server_error" if status >= 500 else "authentication_error" if status == 401 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def anthropic_error(status: int, message: str, headers: Any = None) -> JSONResponse:
    kind = ANTHROPIC_KIND.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def said(f: Failed, names: Optional[Mapping[str, str]] = None) -> tuple[str, Optional[str]]:
    """(the failure in one line, its code); `names` respells the chat fields an API translated
    from its own (e.g. max_tokens -> max_output_tokens)."""
    e = f.error
    if not isinstance(e, MtpError):
        return f"internal error: {e}", None
    code = "context_length_exceeded" if isinstance(e, ContextLengthError) else None
    text = e.spelled(lambda name: f"`{request_name(name)}`")
    for ours, theirs in (names or {}).items():
        text = text.replace(f"`{ours}", f"`{theirs}")
    return text, code


def failed(f: Failed, names: Optional[Mapping[str, str]] = None) -> JSONResponse:
    text, code = said(f, names)
    return error(f.status, text, code=code)


GONE = 499  # (nginx's "client closed the request": nobody reads it)

__all__ = ["error", "anthropic_error", "said", "failed", "GONE"]
