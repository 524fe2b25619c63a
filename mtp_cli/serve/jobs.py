"""A server's unit of work: a request as a Job (what it reports goes through `emit`), and the job
once checked and readied (Begun)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from mtp_cli.serve.events import Event
from mtp_cli.serve.reasoning import answer_start
from mtp_cli.serve.requests import ChatRequest, CompletionRequest
from mtp_cli.serve.tools import Call, ToolPlan
from mtp_cli.session import Prompt
from mtp_cli.speed.auto import Resolved

Request = Union[ChatRequest, CompletionRequest]


@dataclass
class Job:
    request: Union[ChatRequest, CompletionRequest]
    emit: Callable[[Event], None]
    id: str = field(default_factory=lambda: "req-" + secrets.token_hex(6))
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class EmbedJob:
    """Inputs (token ids) to embed; the worker emits Embedded or Failed."""

    inputs: list[list[int]]
    emit: Callable[[Any], None]
    id: str = field(default_factory=lambda: "emb-" + secrets.token_hex(6))
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Embedded:
    vectors: list[Any]  # (numpy rows)


@dataclass(frozen=True)
class Begun:
    """A job checked and readied: its request, tool plan, prompt and resolved settings."""

    job: Job
    req: Union[ChatRequest, CompletionRequest]
    tools: Optional[ToolPlan]
    prompt: Prompt
    res: Resolved
    thinking: bool = False  # (the prompt ends in an open thinking block)
    prompt_text: Optional[str] = None  # (the prompt as decoded, when the request asks for `verbose`)

    @property
    def held(self) -> Optional[Callable[[str], int]]:
        """Where tool calls may begin in the text so far: after a thinking block, never inside it."""
        if self.tools is None:
            return None
        fmt, opened = self.tools.fmt, self.thinking

        def held(text: str) -> int:
            at = answer_start(text, opened)
            h = fmt.held_from(text[at:]) if at >= 0 else -1
            return at + h if h >= 0 else -1

        return held

    def parse(self, text: str) -> tuple[str, list[Call]]:
        """(the content before the calls, the calls) of the answer after a thinking block."""
        at = answer_start(text, self.thinking)
        if self.tools is None or at < 0:
            return text, []
        content, calls = self.tools.fmt.parse(text[at:], self.tools.tools)
        return (text[:at] + content, calls) if calls else (text, [])


__all__ = ["Job", "EmbedJob", "Embedded", "Begun", "Request"]
