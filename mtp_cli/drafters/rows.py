"""DraftRows: what the drafters that decode in a context of their own share (a head, a draft model):
the queue of catch-up rows, the draft-row bookkeeping, the confidence pick, and the lending of a
sequence's rows to another (slots that share a prompt's prefix)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.errors import LlamaError
from mtp_cli.sampling import ConfidenceProbe, DraftSteer


class DraftRows:
    """What the drafters that decode in a context of their own share: the queue of catch-up rows
    (the batch itself, decoded by `flush` when full), the draft-row bookkeeping (where id_last sat,
    how many draft rows past it the context holds) and the confidence pick over the target's
    vocabulary (--spec-draft-p-min)."""

    def __init__(
        self,
        ctx: lx.Context,
        n_vocab: int,
        n_vocab_target: int,
        flush: Callable[[], None],
        n_embd: int = 0,
        seq: int = 0,
    ):
        self.ctx = ctx
        self.batch = lx.Batch(lx.n_batch(ctx), n_embd, seq)
        self.n_vocab, self.n_vocab_target = int(n_vocab), int(n_vocab_target)
        self.flush = flush
        self.p_min = 0.0
        self.probe = ConfidenceProbe(self.n_vocab)
        self.pos = 0  # where id_last sat in the last draft()
        self.n_extra = 0  # draft rows the context holds past pos (to roll back or keep)
        self.plain = self.steer = DraftSteer()  # steer: this step's (the loop's: the target's edits and grammar)

    def pick(self, i: int) -> Optional[int]:
        """The draft token of output row i, as this step's steer picks it (the argmax of the row as the
        target's edits and grammar leave it), or None: its top probability is below p_min, or the
        grammar allows no token."""
        row = lx.logits_rows(self.ctx, i + 1, self.n_vocab)[i][: self.n_vocab_target]
        return self.steer.pick(row, self.p_min, self.probe)

    def enqueue(
        self, tokens: Sequence[int] | np.ndarray, pos0: int, h: Optional[np.ndarray] = None, spare: int = 0
    ) -> None:
        """Queue tokens at pos0.. (with their h rows when the batch carries them), flushing when full;
        `spare` slots stay free (for the draft row of a merged decode)."""
        b, n, k = self.batch, len(tokens), 0
        while k < n:
            room = b.capacity - b.n_tokens - spare
            if room <= 0:
                self.flush()
                continue
            take = min(room, n - k)
            b.add_many(tokens[k : k + take], pos0 + k, h=None if h is None else h[k : k + take])
            k += take

    def lend(self, to: DraftRows, keep: int, pending: np.ndarray, to_pending: np.ndarray) -> bool:
        """`to` (another sequence's rows) made these for positions 0..keep-1: the cells this context
        holds (llama.cpp's per-sequence state, written into `to`'s: a state copy, since seq_cp across
        a split cache's streams lands only at the next decode, too late to check), the
        catch-up rows queued below keep, and in `to_pending` the target's h row of keep-1 where it is
        at hand (a queued row's at keep, or `pending` at the frontier), else zeros. False, `to` not
        holding them, when these do not hold all of them (a head restarted cold since its prompt began,
        or stopped short of keep) or the copy does not (a sliding window's cache writes only its window)."""
        q, n, seq, t = self.batch, self.batch.n_tokens, self.batch.seq_id, to.batch.seq_id
        lo, hi = lx.memory_seq_span(self.ctx, seq)
        first = int(q.pos[0]) if n else hi + 1
        top = int(q.pos[n - 1]) if n else hi
        if self.n_extra or (lo if lo >= 0 else first) != 0 or first > hi + 1 or top < keep - 1:
            return False
        try:
            if hi >= 0:
                lx.copy_seq_state(self.ctx, seq, to.ctx, t)
            else:
                lx.memory_seq_clear(to.ctx, t, data=False)
            whole = lx.memory_seq_rm(to.ctx, t, keep, -1) and lx.memory_seq_span(to.ctx, t) == (
                (0, min(hi, keep - 1)) if hi >= 0 else (-1, -1)
            )
        except LlamaError:
            whole = False
        if not whole:
            lx.memory_seq_clear(to.ctx, t, data=False)
            return False
        to.batch.clear()
        for i in np.flatnonzero(q.pos[:n] < keep):
            to.batch.add(int(q.tokens[i]), int(q.pos[i]), h=q.h[i])
        to.n_extra = 0
        at = np.flatnonzero(q.pos[:n] == keep)  # (a queued row at keep pairs with the h row of keep-1)
        if len(at):
            np.copyto(to_pending, q.h[at[0]])
        elif top + 1 == keep:  # (the lender's frontier: its pending h row is keep-1's)
            np.copyto(to_pending, pending)
        else:
            to_pending[:] = 0.0
        return True


__all__ = ["DraftRows"]
