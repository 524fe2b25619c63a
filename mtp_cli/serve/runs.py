"""One HTTP request's jobs on the engine (one per choice: `n`), their events merged into one asyncio
queue as (choice index, event), and the client watched: a client that disconnects before its
stream begins (or while a plain request runs) cancels every job at its next token.

Every API (chat and text completions, Responses, Anthropic Messages) runs through a Run and only
renders its events its own way.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, Optional, Union

from mtp_cli.serve.engine import Engine
from mtp_cli.serve.events import Done, Event, Failed, Started
from mtp_cli.serve.jobs import Job, Request

Tagged = tuple[int, Optional[Event]]  # (choice index, event); None: the client left


class Run:
    """`begin()` submits the jobs and waits for the first to start (its checks passed: the HTTP
    status can be sent); then `next()` gives the events in order of arrival, `whole()` every
    choice's Done. `close()` cancels whatever still runs."""

    def __init__(self, engine: Engine, requests: Sequence[Request], client: Any):
        self.engine, self.client = engine, client
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Tagged] = asyncio.Queue()
        self.jobs = [Job(r, self._poster(i)) for i, r in enumerate(requests)]
        self.early: deque[Tagged] = deque()  # (what came while begin() waited for the first start)
        self.started: Optional[Started] = None
        self._watcher: Optional[asyncio.Task[None]] = None

    @property
    def id(self) -> str:
        return self.jobs[0].id[4:]

    def _poster(self, i: int) -> Any:
        def post(ev: Event) -> None:  # (on the worker thread)
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, ev))
            except RuntimeError:  # (the loop closed: the server is shutting down)
                pass

        return post

    async def begin(self) -> Union[Started, Failed, None]:
        """The first job's Started (its prompt is checked), its Failed, or None (the client left)."""
        for job in self.jobs:
            self.engine.submit(job)
        self._watcher = asyncio.create_task(self._watch())
        while True:
            i, ev = await self.queue.get()
            if ev is None or isinstance(ev, Failed):
                self.close()
                return ev
            if isinstance(ev, Started) and self.started is None:
                self.started = ev
                return ev
            self.early.append((i, ev))

    def streaming(self) -> None:
        """From here the streaming response itself notices a client gone."""
        if self._watcher is not None:
            self._watcher.cancel()

    async def next(self) -> Tagged:
        return self.early.popleft() if self.early else await self.queue.get()

    async def whole(self) -> Union[list[Done], Failed, None]:
        """Every choice's Done, in order; the first Failed; or None (the client left)."""
        done: dict[int, Done] = {}
        while len(done) < len(self.jobs):
            i, ev = await self.next()
            if ev is None or isinstance(ev, Failed):
                self.close()
                return ev
            if isinstance(ev, Done):
                done[i] = ev
        return [done[i] for i in range(len(self.jobs))]

    def close(self) -> None:
        for job in self.jobs:
            job.cancelled.set()  # (queued: skipped; running: stopped at its next token; ended: nothing)
        if self._watcher is not None:
            self._watcher.cancel()

    async def _watch(self) -> None:
        """Cancel the jobs once the client disconnects (the body is read: the next message is that)."""
        while True:
            message = await self.client.receive()
            if message["type"] == "http.disconnect":
                for job in self.jobs:
                    job.cancelled.set()
                self.queue.put_nowait((-1, None))
                return


def choices(req: Request, n: int) -> list[Request]:
    """The request once per choice: a given seed is the first choice's, the next choices' follow it."""
    if n == 1:
        return [req]
    seed = req.seed if req.seed is not None and req.seed >= 0 else None
    return [req.model_copy(update={"n": 1, "seed": None if seed is None else seed + i}) for i in range(n)]


__all__ = ["Run", "Tagged", "choices"]
