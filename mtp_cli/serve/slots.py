"""The worker of a server with parallel slots (`serve -np N`): each request runs in a slot (a sequence
of the one target context, with its own session, sampler, grammar, penalties and stop state), and
every running slot advances in one shared decode per step (mtp_cli.slots.BatchRunner). A new
request takes the free slot whose memory shares the longest prefix with its prompt (llama-server's
choice); with every slot busy it waits in the queue. A slot's client leaving, or a stop string,
ends that slot between two steps; the others go on.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Optional, Protocol, Union

from mtp_cli.config import GenConfig
from mtp_cli.errors import ChatTemplateError, ConfigError
from mtp_cli.memory import common_prefix
from mtp_cli.runtime import Runtime
from mtp_cli.serve.events import Failed, Started, Streamed, TextStream, TokenProb, reporter
from mtp_cli.serve.jobs import Begun, EmbedJob, Job
from mtp_cli.serve.metrics import Metrics
from mtp_cli.session import Session, Taken
from mtp_cli.slots import BatchRunner, StepOut
from mtp_cli.speed.auto import AutoDraft
from mtp_cli.stats import GenStats, TokenEvent

log = logging.getLogger(__name__)

SHARE_ENOUGH = 0.5  # a free slot holding this share of a prompt takes it over the least recently used one


class Host(Protocol):
    """What the worker needs of its engine (mtp_cli.serve.engine.Engine)."""

    rt: Runtime
    base: GenConfig
    _jobs: queue.Queue[Union[Job, EmbedJob, None]]
    _closing: threading.Event
    _active: dict[int, Job]
    metrics: Metrics

    def begin(self, job: Job, session: Session, auto: Optional[AutoDraft] = None) -> Begun: ...

    def finish(self, b: Begun, out: Streamed, st: GenStats, slot: int = 0) -> None: ...

    def _prob(self, ev: TokenEvent) -> TokenProb: ...

    def embed(self, job: EmbedJob) -> None: ...

    def skip(self, job: Union[Job, EmbedJob]) -> None: ...


@dataclass
class _Slot:
    begun: Begun
    stream: TextStream
    taken: Taken  # (its session's record of what it emitted)
    stats: GenStats


class SlotWorker:
    """Runs an engine's jobs in its runtime's `n_parallel` slots (see the module docstring)."""

    def __init__(self, engine: Host):
        self.e = engine
        rt = engine.rt
        n = rt.config.n_parallel
        self.sessions = [Session(rt, s) for s in range(n)]
        self.autos = [AutoDraft(rt) for _ in range(n)]  # (a slot's adaptive N learns from its own steps)
        self.fresh = Session(rt)  # (no history: renders a prompt whole)
        self.runner = BatchRunner(rt)
        self.slots: dict[int, _Slot] = {}
        self._used = [0] * n  # when each slot last took a job (0: never)
        self._n_jobs = 0
        self._stopping = False

    def run(self) -> None:
        try:
            while not self._stopping:
                self._admit(block=not self.slots)
                self._drop_cancelled()
                if self.slots:
                    self._step()
        finally:
            self.runner.close()

    # -- admission ------------------------------------------------------------------------------

    def _admit(self, block: bool) -> None:
        """A queued job into a free slot (waiting for one when nothing runs): one per step, so the
        first of several arriving together starts on the next step, its prompt readied alone."""
        while len(self.slots) < len(self.sessions):
            try:
                job = self.e._jobs.get() if block else self.e._jobs.get_nowait()
            except queue.Empty:
                return
            block = False
            if job is None:
                self._stopping = True
                return
            if job.cancelled.is_set() or self.e._closing.is_set():
                self.e.skip(job)
                continue
            if isinstance(job, EmbedJob):  # (no slot: run between two steps)
                self.e.embed(job)
                continue
            self._start(job)
            if self.slots:
                return

    def _start(self, job: Job) -> None:
        try:
            seq, b = self._pick(job)
            prep, taken = self.sessions[seq].prepare(b.prompt, b.res.config, b.res.policy)
            prep.progress = reporter(job) if b.req.return_progress else None
            forced = self.e.base.draft_mode == "fixed" or b.req.spec_n_max is not None
            self.runner.add(prep, gate=not forced)  # (a forced N, the server's or the request's, stays forced)
        except (ConfigError, ChatTemplateError) as e:
            job.emit(Failed(e, 400))
            return
        except Exception as e:
            log.exception("%s: failed", job.id)
            job.emit(Failed(e, 500))
            return
        self.e._active[seq] = job
        self._n_jobs += 1
        self._used[seq] = self._n_jobs
        live = prep.stats if b.req.timings_per_token else None
        text = TextStream(job, b.req.stop_strings(), self.e._prob, b.held, live)
        self.slots[seq] = _Slot(b, text, taken, prep.stats)
        job.emit(Started(len(b.prompt.tokens), prep.stats.n_cached, b.thinking, b.prompt_text))

    def _pick(self, job: Job) -> tuple[int, Begun]:
        """A free slot for the job, and the job readied there (its prompt is the slot's session's): one
        whose memory the prompt continues (the longest), else one whose memory holds most of the
        prompt, else the one used least recently (an empty one first), so that a new conversation
        does not push out another's cache for a shared template prefix."""
        free = [s for s in range(len(self.sessions)) if s not in self.slots]
        held = {s: self.e.rt.held(s) for s in free}
        whole = self.e.begin(job, self.fresh).prompt.tokens  # (rendered whole: what a slot's own session may extend)
        near = [s for s in free if held[s] and common_prefix(held[s], whole) >= SHARE_ENOUGH * len(held[s])]
        # (every other slot is alike: the least recently used stands for them)
        free = near + sorted(set(free) - set(near), key=lambda s: self._used[s])[:1]
        begun = {s: self.e.begin(job, self.sessions[s], self.autos[s]) for s in free}
        shared = {s: common_prefix(held[s], begun[s].prompt.tokens) for s in free}
        goes_on = [s for s in free if held[s] and shared[s] >= len(held[s]) - 1]
        best = max(goes_on or free, key=lambda s: shared[s])
        if not goes_on and shared[best] < SHARE_ENOUGH * len(begun[best].prompt.tokens):
            best = min(free, key=lambda s: self._used[s])
        return best, begun[best]

    # -- steps ----------------------------------------------------------------------------------

    def _drop_cancelled(self) -> None:
        for seq, slot in list(self.slots.items()):
            if slot.begun.job.cancelled.is_set():
                self.runner.cancel(seq)
                self._end(seq, StepOut(ended=True))

    def _step(self) -> None:
        outs = self.runner.step()
        self.e.metrics.step(len(outs))
        for seq, out in outs.items():
            slot = self.slots[seq]
            cut = False
            for ev in out.events:
                slot.taken.add(ev)
                if slot.stream.feed(ev):
                    cut = True
                    break
            if cut and not out.ended:
                self.runner.cancel(seq)
            if cut or out.ended:
                self._end(seq, out)

    def _end(self, seq: int, out: StepOut) -> None:
        """The slot's generation ended: Done (or Failed), and the slot is free."""
        slot = self.slots.pop(seq)
        job = self.e._active.pop(seq, slot.begun.job)
        if out.error is not None:
            status = 400 if isinstance(out.error, (ConfigError, ChatTemplateError)) else 500
            if status == 500:
                log.error("%s: failed: %s", job.id, out.error)
            job.emit(Failed(out.error, status))
            return
        try:
            self.e.finish(slot.begun, slot.stream.close(), slot.stats, seq)
        except Exception as e:  # (no request can stop the worker: every other slot waits on it)
            log.exception("%s: failed", job.id)
            job.emit(Failed(e, 500))


__all__ = ["SlotWorker"]
