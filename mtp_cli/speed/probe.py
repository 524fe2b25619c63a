"""Measuring the cost model (mtp_cli.speed.costs) with llama_decode directly.

T: one plain token; v(N): a target decode of N+1 tokens with logits on every row and the MTP h
rows on, what an MTP verify step decodes; after each verify at N >= 1, the step's head decodes
through the MTP drafter's public probe (MtpDrafter.cost_probe): the first of m rows (m cycling
through 1..N+1: catch-up rows + the draft row; c(m)), then N-1 of one row (c). They are timed
interleaved with the verify decodes, as a step runs them (the two models evict each other from
the CPU caches: timed back to back, a step's head decodes came out 0.5-1.0 ms cheaper than in
the loop). Each sample decodes at the next position and removes the N extra cells (and the head's
rows) again, as a step that accepts nothing; each round decodes a block of `reps` samples per N
(after one whose verify is not timed: llama.cpp reuses a graph only for the same batch shape, as
in a run at fixed N), rotating the order of N so drift hits every N alike; medians. Chained
heads (one decode per head) are approximated by head 0's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from mtp_cli import drafters
from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import HeadProbe
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.errors import ConfigError, LlamaError, NoMtpHeadError
from mtp_cli.runtime import Runtime
from mtp_cli.speed.costs import CostModel

_now = time.perf_counter


def _decode_prompt(tgt: lx.Context, batch: lx.Batch, d: MtpDrafter, prompt: Sequence[int]) -> None:
    """Decode the prompt into the target in n_batch chunks, logits on the last row; the drafter
    follows each chunk (on_prefill), as the loop's own fills do."""
    toks = np.asarray(prompt, dtype=np.int32)
    n_b = lx.n_batch(tgt)
    for p0 in range(0, len(toks), n_b):
        chunk = toks[p0 : p0 + n_b]
        batch.clear()
        batch.add_many(chunk, p0, logits_last=p0 + n_b >= len(toks))
        lx.decode(tgt, batch)
        d.on_prefill(chunk, p0)


class _Probe:
    """One measurement: a target context holding the prompt, the head's probe, the samples so far."""

    def __init__(self, rt: Runtime, d: MtpDrafter, tgt: lx.Context, prompt: list[int], n_max: int, reps: int):
        self.rt, self.tgt, self.n_max, self.reps, self.seq = rt, tgt, n_max, reps, d.seq
        self.toks = [prompt[i % len(prompt)] for i in range(n_max + 1)]
        self.b = lx.Batch(max(lx.n_batch(tgt), n_max + 1), seq_id=d.seq)
        self.head: HeadProbe = d.cost_probe(n_max + 1)
        self.plain: list[float] = []
        self.verify: list[list[float]] = [[] for _ in range(n_max + 1)]
        self.first: list[list[float]] = [[] for _ in range(n_max + 1)]  # c(m), by m - 1
        self.single: list[float] = []  # c
        self.n_first = 0  # first decodes measured so far: m cycles with it, so the measured m are always 1..k
        self._prefill(d, prompt)
        self.pos = self.p_end = self.dpos = len(prompt)

    def _prefill(self, d: MtpDrafter, prompt: list[int]) -> None:
        lx.memory_seq_clear(self.tgt, self.seq)
        d.begin(prompt)
        lx.set_embeddings_nextn(self.tgt, True, False)
        _decode_prompt(self.tgt, self.b, d, prompt)
        d.catch_up()  # the head's memory now holds the prompt

    def rewind(self) -> None:
        """Decode cost grows with the position: measure every block from the prompt's end."""
        if not self.rt.recurrent:  # (a recurrent state cannot roll back that far; its cost hardly depends on pos)
            lx.memory_seq_rm(self.tgt, self.seq, self.p_end, -1)
            self.pos = self.p_end

    def plain_block(self) -> None:
        """T: one token, plain (no h rows), kept, as plain decoding does."""
        self.rewind()
        lx.set_embeddings_nextn(self.tgt, False, False)
        for i in range(self.reps + 1):
            self.b.clear()
            self.b.add(self.toks[0], self.pos, logits=True)
            t = _now()
            lx.decode(self.tgt, self.b)
            if i:  # the first decode of a block rebuilds the graph
                self.plain.append(_now() - t)
            self.pos += 1
        lx.set_embeddings_nextn(self.tgt, True, False)

    def verify_block(self, n: int) -> None:
        """Blocks of one N, as a run at fixed N decodes (llama.cpp reuses the graph)."""
        self.rewind()
        for i in range(self.reps + 1):
            self.b.clear()
            for j in range(n + 1):
                self.b.add(self.toks[j], self.pos + j, logits=True)
            t = _now()
            lx.decode(self.tgt, self.b)
            if i:
                self.verify[n].append(_now() - t)
            if n and not lx.memory_seq_rm(self.tgt, self.seq, self.pos + 1, -1):
                raise LlamaError(f"the target context refused to roll back {n} positions while measuring")
            self.head_step(n)  # every sample timed: the head's shapes change every step anyway
            self.pos += 1

    def head_step(self, n: int) -> None:
        """A step's head decodes at N = n; the head's memory is not advanced (the rows are removed
        again). A drafter sharing the target's memory has no catch-up: m = 1."""
        if not n:
            return
        m = 1 if self.head.shares_memory else 1 + self.n_first % (self.n_max + 1)
        p = self.dpos
        for k in range(n):
            rows = m if k == 0 else 1
            # (a drafter sharing the target's memory decodes right after what the target holds, at pos + 1:
            # the verify block kept its first row, at pos)
            dt = self.head.decode(self.toks[:rows], self.pos + 1 if self.head.shares_memory else p)
            (self.first[m - 1] if k == 0 else self.single).append(dt)
            p += rows
        self.n_first += 1
        self.head.reset(self.dpos)

    def result(self) -> CostModel:
        T = statistics.median(self.plain)
        rows = [statistics.median(x) / T for x in self.first if x]
        c = statistics.median(self.single) / T if self.single else rows[0]
        return CostModel(t_ms=1e3 * T, verify=[statistics.median(v) / T for v in self.verify], draft=c, draft_rows=rows)


def measure_costs(
    rt: Runtime, cfg: GenConfig, n_max: int, prompt: Sequence[int], *, rounds: int = 3, reps: int = 4
) -> CostModel:
    """The machine's cost model for rt's MTP head at N = 0..n_max (see the module docstring)."""
    if n_max < 1:
        raise ConfigError(f"the cost model needs N >= 1 (got {n_max})")
    if not rt.can_run("mtp"):
        raise NoMtpHeadError(f"{rt.model_path.name}: the cost model needs the MTP head (load the runtime for mtp)")
    base = drafters.validated(replace(cfg, spec_type="mtp", draft_n_max=n_max, draft_p_min=0.0))
    ctxs, d = rt.contexts(base)
    assert isinstance(d, MtpDrafter)
    need = rounds * (reps + 1) * (n_max + 2) + n_max + 2
    toks = list(prompt)[: max(1, min(len(prompt), ctxs.n_ctx - need))]
    if len(toks) + need > ctxs.n_ctx:
        raise ConfigError(f"the context ({ctxs.n_ctx} tokens) is too small to measure costs at N={n_max}")
    probe = _Probe(rt, d, ctxs.target, toks, n_max, reps)
    try:
        for r in range(rounds):
            probe.plain_block()
            order = list(range(n_max + 1))
            for n in order[r % len(order) :] + order[: r % len(order)]:
                probe.verify_block(n)
    finally:
        lx.memory_seq_clear(ctxs.target, d.seq)
        ctxs.held.pop(d.seq, None)  # (the memory no longer holds what the last generation left)
        d.begin([])
    return probe.result()


__all__ = ["measure_costs"]
