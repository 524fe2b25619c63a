"""Choosing the target's token at a verified position.

Greedy (temp <= 0) is numpy's argmax on the logits row (first maximum, as llama.cpp's greedy
sampler). Otherwise the token comes from llama.cpp's own sampler chain (top_k -> top_p -> min_p
-> temp -> dist(seed)), so the distribution, and for a given seed the very stream of random draws,
is llama.cpp's.

Exactness of speculative sampling with a deterministic draft: the verify loop samples position 0,
1, 2, ... of the verify batch in order from the target's own logits, one random draw per emitted
token, and keeps a draft token only while it equals the sample. The emitted sequence is then
drawn from exactly the distribution plain decoding draws from (same seed -> same draws).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig


class TokenSampler:
    """Samples a token from one output row of the last decode of a context."""

    def __init__(self, *, temp: float, top_k: int, top_p: float, min_p: float, seed: int):
        self.greedy = temp <= 0.0
        self._chain: Optional[lx.Sampler] = None
        if not self.greedy:
            self._chain = lx.sampler_chain(
                top_k=top_k, top_p=top_p, min_p=min_p, temp=temp, seed=lx.DEFAULT_SEED if seed < 0 else seed
            )

    def sample(self, ctx: lx.Context, i: int, row: np.ndarray) -> int:
        """Token for batch index `i`; `row` is that index's logits view (used when greedy)."""
        if self._chain is None:
            return int(row.argmax())
        return lx.sampler_sample(self._chain, ctx, i)

    def close(self) -> None:
        if self._chain is not None:
            self._chain.close()
            self._chain = None


class RowEdits:
    """What llama.cpp's sampler chain does to a row before its other samplers: the EOG logit bias of
    -inf (--ignore-eos), then the repeat penalty over the last `repeat_last_n` tokens (prompt included;
    a logit <= 0 is multiplied by the penalty, one above 0 divided). Applied in place to the target's
    own logits buffer, so greedy argmax and llama.cpp's sampler chain both choose from the edited rows;
    row i of a verify batch is penalized for the tokens before it (history, then drafts[:i]), exactly
    as plain decoding would have."""

    def __init__(self, cfg: GenConfig, eog_tokens: Sequence[int]):
        self.penalty = np.float32(cfg.repeat_penalty) if cfg.penalized else None
        self.last_n = cfg.repeat_last_n
        self.eog = np.asarray(eog_tokens, dtype=np.int64) if cfg.ignore_eos and len(eog_tokens) else None
        self.active = self.penalty is not None or self.eog is not None  # (read every step)

    def apply(self, rows: np.ndarray, history: Sequence[int], drafts: Sequence[int] = ()) -> None:
        """Edit rows[i] (the logits after history + drafts[:i]) in place."""
        if self.eog is not None:
            rows[:, self.eog] = -np.inf
        if self.penalty is None:
            return
        n = self.last_n
        tail = [*history[-n:], *drafts]
        end0 = len(tail) - len(drafts)
        for i in range(rows.shape[0]):
            seen = np.unique(np.asarray(tail[max(0, end0 + i - n) : end0 + i], dtype=np.int64))
            row, v = rows[i], rows[i, seen]
            row[seen] = np.where(v <= 0, v * self.penalty, v / self.penalty)


def verify_greedy(rows: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """(n_accepted, next token): keep drafts while each equals the target's argmax at its row;
    the next token is the argmax of the first row that disagreed (or of the last row)."""
    k = len(drafts)
    if not k:
        return 0, int(rows[0].argmax())
    am = rows.argmax(axis=1)
    a = 0
    while a < k and am[a] == drafts[a]:
        a += 1
    return a, int(am[a])


def verify_sampled(sampler: TokenSampler, ctx: lx.Context, rows: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """(n_accepted, next token): sample rows 0, 1, ... in order from the target's own
    distribution (one draw each) and keep a draft token only while it equals the sample. The
    emitted tokens are then distributed exactly as in plain sampling (deterministic drafter)."""
    k = len(drafts)
    a = 0
    while True:
        s = sampler.sample(ctx, a, rows[a])
        if a < k and s == drafts[a]:
            a += 1
            continue
        return a, s


class ConfidenceProbe:
    """The softmax maximum of a logits row (the draft's top probability, for --spec-draft-p-min),
    computed in a reusable scratch buffer: no vocab-sized allocation per draft token."""

    def __init__(self, n_vocab: int):
        self.buf = np.empty(int(n_vocab), dtype=np.float32)

    def top_prob(self, row: np.ndarray) -> float:
        buf = self.buf[: row.shape[0]]
        m = row.max()
        np.subtract(row, m, out=buf)
        np.exp(buf, out=buf)
        return float(1.0 / buf.sum(dtype=np.float64))


__all__ = ["TokenSampler", "RowEdits", "ConfidenceProbe", "verify_greedy", "verify_sampled"]
