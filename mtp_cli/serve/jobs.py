"""A server's unit of work: a request as a Job (what it reports goes through `emit`), and the job
once checked and readied (Begun)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from mtp_cli.serve.events import Event
from mtp_cli.serve.requests import ChatRequest, CompletionRequest
from mtp_cli.serve.tools import ToolPlan
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

    @property
    def held(self) -> Optional[Callable[[str], int]]:
        return self.tools.fmt.held_from if self.tools else None


__all__ = ["Job", "EmbedJob", "Embedded", "Begun", "Request"]
