"""Generations in several sequences of one runtime, batched: each step is one target decode holding
every running sequence's rows (its last token and drafts, or a chunk of its prompt), so B sequences
cost about one decode of B rows, not B decodes. A sequence joins or leaves between any two steps
(continuous batching); prompt chunks take the room the steps leave, so running streams keep flowing
while a new prompt is read.

    runner = BatchRunner(rt)
    runner.add(rt.prepare(prompt_a, cfg, seq=0))
    runner.add(rt.prepare(prompt_b, cfg, seq=1))
    while runner.running:
        for seq, out in runner.step().items():
            ...  # out.events: this step's tokens; out.ended: its generation ended (out.error: why)

Each sequence's loop (mtp_cli.loop) chooses, drafts and rolls back as alone; only the decode is
shared. Every step's decode is measured into the context's StepCosts (a decode of R rows, whoever's
rows they are), from which a sequence whose draft length is not forced decides beside the others
(mtp_cli.load). The drafters share one context, and their decodes: each draft position's rows of
every sequence in one decode (drafters.joint), as llama.cpp's one speculative context for all slots.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Optional

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.base import Drafting
from mtp_cli.drafters.joint import Joint
from mtp_cli.errors import MtpError
from mtp_cli.load import DraftRecord, LoadGate
from mtp_cli.loop import VerifyLoop
from mtp_cli.runtime import Prepared, Runtime
from mtp_cli.stats import GenStats, TokenEvent

_now = time.perf_counter

LOAD_AFTER = 16  # steps after the last shared one during which a gated sequence still counts its rows


@dataclass
class StepOut:
    """What one step gave a sequence."""

    events: list[TokenEvent] = field(default_factory=list)
    ended: bool = False
    error: Optional[BaseException] = None  # why it ended, when it failed


@dataclass
class _Running:
    prep: Prepared
    loop: VerifyLoop
    t0: float
    ready: bool  # begin() found something to generate

    @property
    def stats(self) -> GenStats:
        return self.prep.stats


class BatchRunner:
    """Steps the generations of several sequences of one runtime, one shared decode per step."""

    def __init__(self, rt: Runtime, joint: bool = True):
        """joint: every sequence's drafter decodes beside the others' (one head decode per draft
        position for all), else each alone."""
        self.rt = rt
        self._joint = Joint(merge=joint)
        self.running: dict[int, _Running] = {}
        self._batch: Optional[lx.Batch] = None
        self._steps = 0
        self._last: dict[int, tuple[int, int]] = {}  # the last step's (rows, tokens), by sequence
        self._shared_at = -LOAD_AFTER  # the last step that held more than one sequence
        self._shared: dict[int, tuple[int, int]] = {}  # that step's (rows, tokens), by sequence
        self.records: dict[tuple[int, str], DraftRecord] = {}  # by sequence and drafter: kept across generations

    def add(self, prep: Prepared, gate: bool = False) -> GenStats:
        """Start a prepared generation (Runtime.prepare); its tokens come from the next steps. gate:
        beside other sequences it drafts only what pays for its rows (load.LoadGate: a draft length
        not forced)."""
        if prep.seq in self.running:
            raise MtpError(f"sequence {prep.seq} is running")
        if gate:
            rec = self.records.setdefault((prep.seq, prep.drafter.name), DraftRecord())
            d, seq = prep.drafter, prep.seq
            clock = (lambda: d.t_decode) if d.drafts_with_model else None
            by_load = LoadGate(
                prep.policy, lambda: self._others(seq), prep.ctxs.costs, rec, clock, prep.cfg.draft_n_min
            )
            by_load.can_sleep = d.can_sleep
            by_load.start()
            prep.policy = by_load
        loop = self.rt.start(prep)
        r = _Running(prep, loop, _now(), False)
        try:
            r.ready = loop.begin(prep.prompt, prep.kept)
        except BaseException:
            self._end(r)
            raise
        self.running[prep.seq] = r
        return prep.stats

    def _others(self, seq: int) -> tuple[int, int, int]:
        """The rows the other running sequences put in the last step, the tokens it gave them and the
        drafts among the rows (a prompt chunk, or one that joined since: one row, one token);
        alone, those of the last step that held several, for LOAD_AFTER steps (a sequence alone for
        a step or two between others' requests still counts them), else (0, 0, 0)."""
        last = [self._last.get(s, (1, 1)) for s in self.running if s != seq]
        if not last and self._steps - self._shared_at <= LOAD_AFTER:
            last = [rt for s, rt in self._shared.items() if s != seq]
        return sum(r for r, _ in last), sum(t for _, t in last), sum(r - 1 for r, _ in last)

    def cancel(self, seq: int) -> Optional[GenStats]:
        """End a sequence's generation between steps ("interrupted"; its memory stays known)."""
        r = self.running.pop(seq, None)
        if r is None:
            return None
        r.loop.suspended = True  # (between decodes: the memory holds exactly what it decoded)
        self._end(r)
        return r.stats

    def step(self) -> dict[int, StepOut]:
        """One decode holding every running sequence's rows; what each got. Ended ones leave."""
        out = {seq: StepOut() for seq in self.running}
        self._steps += 1
        placed = self._fill(out)
        self._h_rows([r.loop for r, _, _ in placed])
        shape = self._shape(placed)
        if placed:
            t = _now()
            try:
                lx.decode(placed[0][0].loop.tgt, self._batch)  # type: ignore[arg-type]
            except BaseException as e:
                for r, _, _ in placed:
                    out[r.prep.seq].error, out[r.prep.seq].ended = e, True
                placed = []
            dt = _now() - t
            if placed:  # (a decode of R rows, whoever's: what drafting beside others weighs; a prompt's apart)
                costs = placed[0][0].loop.costs
                if 0 in shape.values():
                    costs.unobserved()
                else:
                    costs.observe(self._batch.n_tokens - 1, dt)  # type: ignore[union-attr]
        for r, row0, out0 in placed:
            o = out[r.prep.seq]
            try:
                o.ended = _drain(r.loop.after(row0, out0, dt), o.events)
            except BaseException as e:
                o.error, o.ended = e, True
        self._count(shape, out)
        for seq, o in out.items():
            if o.ended:
                r = self.running.pop(seq)
                if o.error is not None and r.stats.stop_reason is None:
                    r.stats.stop_reason = "error"
                self._end(r)
        return out

    def _fill(self, out: dict[int, StepOut]) -> list[tuple[_Running, int, int]]:
        """The batch: steps first (a few rows each, and each stream waits on them; their drafters'
        decodes shared: drafters.joint), then a chunk of the prompt that came first, in the room left:
        prompts one after another, so that of k prompts arriving together the first gets its first
        token after one prompt's pass, not k (on a machine where compute is the limit, batching
        prompts saves nothing). Loops that are done are marked ended."""
        b = self._batch_of()
        b.clear()
        placed: list[tuple[_Running, int, int]] = []
        for seq, drafts in self._drafts(out).items():
            self._place(seq, drafts, out, placed)
        first = next((s for s, r in self.running.items() if r.ready and r.loop.prefilling), None)
        if first is not None and b.n_tokens < b.capacity:  # (else its prompt waits for the next step)
            self._place(first, None, out, placed)
        return placed

    def _place(
        self, seq: int, drafts: Optional[list[int]], out: dict[int, StepOut], placed: list[tuple[_Running, int, int]]
    ) -> None:
        """A loop's rows into the batch (a step's, with its drafts, or a prompt chunk: None)."""
        b, r = self._batch, self.running[seq]
        assert b is not None
        row0, out0 = b.n_tokens, int(b.logits[: b.n_tokens].sum())
        try:
            r.loop.fill(b, drafts)
            placed.append((r, row0, out0))
        except BaseException as e:
            out[seq].error, out[seq].ended = e, True

    def _drafts(self, out: dict[int, StepOut]) -> dict[int, list[int]]:
        """This step's drafts of every running loop past its prompt, by sequence, drafted together.
        Loops that are done or failed are marked ended."""
        steps: dict[int, Drafting] = {}
        for seq, r in self.running.items():
            o = out[seq]
            if not r.ready:
                o.ended = True
            elif not r.loop.prefilling:
                try:
                    step = r.loop.proposal()
                except BaseException as e:
                    o.error, o.ended = e, True
                    continue
                if step is None:
                    o.ended = True
                else:
                    steps[seq] = step
        drafts = {}
        results = self._joint.run(steps)
        for seq in steps:  # (in the running order, not the order their drafting ended)
            got = results[seq]
            if isinstance(got, BaseException):
                out[seq].error, out[seq].ended = got, True
            else:
                drafts[seq] = got
        return drafts

    def _shape(self, placed: list[tuple[_Running, int, int]]) -> dict[int, int]:
        """This step's rows by sequence; a prompt chunk's as 0."""
        ends = [row0 for _, row0, _ in placed[1:]] + [self._batch.n_tokens if self._batch else 0]
        return {r.prep.seq: 0 if r.loop.prefilling else end - row0 for (r, row0, _), end in zip(placed, ends)}

    def _count(self, shape: dict[int, int], out: dict[int, StepOut]) -> None:
        """The step's (rows, tokens) by sequence, a prompt chunk's as (1, 1) (what _others reads next)."""
        self._last = {s: (n, len(out[s].events)) if n else (1, 1) for s, n in shape.items()}
        if len(self._last) > 1:
            self._shared, self._shared_at = self._last, self._steps

    @staticmethod
    def _h_rows(loops: list[VerifyLoop]) -> None:
        """The target computes h rows (nextn embeddings) for a decode if any of its sequences'
        drafters reads them (the setting is the context's, not a sequence's: an asleep drafter's
        sequence gets them too, and its loop is told so)."""
        reading = [lp for lp in loops if lp.drafter.target_h]
        if reading:
            on = any(lp.h_on for lp in reading)
            lx.set_embeddings_nextn(reading[0].tgt, on, False)
            for lp in reading:
                lp.h_on = on

    def _batch_of(self) -> lx.Batch:
        tgt = next(iter(self.running.values())).loop.tgt if self.running else None
        cap = lx.n_batch(tgt) if tgt is not None else 1
        if self._batch is None or self._batch.capacity != cap:
            self._batch = lx.Batch(cap)
        return self._batch

    def _end(self, r: _Running) -> None:
        try:
            r.loop.finish(r.t0)
        finally:
            self.rt.ended(r.prep, r.loop)

    def close(self) -> None:
        """End every running generation ("interrupted")."""
        for seq in list(self.running):
            self.cancel(seq)


def _drain(gen: Generator[TokenEvent, None, bool], into: list[TokenEvent]) -> bool:
    """Collect a generator's events; its return value."""
    while True:
        try:
            into.append(next(gen))
        except StopIteration as e:
            return bool(e.value)


__all__ = ["BatchRunner", "StepOut"]
