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

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig


class TokenSampler:
    """Samples a token from one output row of the last decode of a context."""

    def __init__(self, *, temp: float, top_k: int, top_p: float, min_p: float, seed: int):
        self.greedy = temp <= 0.0
        self.base = 0  # the batch row of output row 0 (a decode may hold other sequences' rows first)
        self._chain: Optional[lx.Sampler] = None
        if not self.greedy:
            self._chain = lx.sampler_chain(
                top_k=top_k, top_p=top_p, min_p=min_p, temp=temp, seed=lx.DEFAULT_SEED if seed < 0 else seed
            )

    def sample(self, ctx: lx.Context, i: int, row: np.ndarray) -> int:
        """Token for batch index `base + i`; `row` is that index's logits view (used when greedy)."""
        if self._chain is None:
            return int(row.argmax())
        return lx.sampler_sample(self._chain, ctx, self.base + i)

    def close(self) -> None:
        if self._chain is not None:
            self._chain.close()
            self._chain = None


class RowEdits:
    """What llama.cpp's sampler chain does to a row before its other samplers: the logit biases (the
    user's, and -inf on EOG tokens with --ignore-eos), then the penalties over the last
    `repeat_last_n` tokens (prompt included): a seen token's logit <= 0 is multiplied by the repeat
    penalty, one above 0 divided, then it loses frequency_penalty per time seen and presence_penalty
    once. The one description of those edits: the target's verified rows (`apply`, in place in its
    logits buffer, so greedy argmax and llama.cpp's sampler chain both choose from the edited rows;
    row i of a verify batch is penalized for the tokens before it, history then drafts[:i], exactly
    as plain decoding would have) and a drafter's draft rows (`edit`, through DraftSteer: draft i
    over the same window as the verify row that will judge it). Each touches only the biased tokens
    and those in the window, never the whole vocabulary."""

    def __init__(self, cfg: GenConfig, eog_tokens: Sequence[int]):
        self.penalty = np.float32(cfg.repeat_penalty) if cfg.penalized else None
        self.freq, self.presence = np.float32(cfg.frequency_penalty), np.float32(cfg.presence_penalty)
        self.last_n = cfg.repeat_last_n
        bias = dict(cfg.logit_bias)
        if cfg.ignore_eos:
            bias.update((int(t), -np.inf) for t in eog_tokens)
        self.bias_ids = np.asarray(list(bias), dtype=np.int64)
        self.bias = np.asarray(list(bias.values()), dtype=np.float32)
        self.active = self.penalty is not None or len(self.bias_ids) > 0  # (read every step)

    def apply(self, rows: np.ndarray, history: Sequence[int], drafts: Sequence[int] = ()) -> None:
        """Edit rows[i] (the logits after history + drafts[:i]) in place."""
        if len(self.bias_ids):
            rows[:, self.bias_ids] += self.bias
        if self.penalty is None:
            return
        n = self.last_n
        tail = [*history[-n:], *drafts]
        end0 = len(tail) - len(drafts)
        for i in range(rows.shape[0]):
            self._penalize(rows[i], tail[max(0, end0 + i - n) : end0 + i])

    def edit(self, row: np.ndarray, window: Iterable[int]) -> None:
        """Edit one row in place; `window`: the last repeat_last_n tokens before it. A draft model's
        row may be shorter than the target's vocabulary: ids past its end cannot be drafted, so skip."""
        n = len(row)
        if len(self.bias_ids):
            ids, bias = self.bias_ids, self.bias
            if ids.max() >= n:
                ids, bias = ids[ids < n], bias[ids < n]
            row[ids] += bias
        if self.penalty is not None:
            self._penalize(row, window)

    def _penalize(self, row: np.ndarray, window: Iterable[int]) -> None:
        assert self.penalty is not None
        seen, count = np.unique(np.fromiter(window, dtype=np.int64), return_counts=True)
        if len(seen) and seen[-1] >= len(row):  # (sorted: a draft row shorter than the target's)
            seen, count = seen[seen < len(row)], count[seen < len(row)]
        v = row[seen]
        v = np.where(v <= 0, v * self.penalty, v / self.penalty)
        row[seen] = v - count.astype(np.float32) * self.freq - self.presence


class DraftSteer:
    """How a drafter picks its tokens from its own logits rows: the argmax (a deterministic draft:
    sampling stays exact, ARCHITECTURE §3) after the edits the target's row at the same position will
    get, so a draft is not wrong by construction. For one step (the loop's, `for_step`): the target's
    RowEdits over the window its verify row will read (the history, then the drafts picked so far)
    and a copy of its grammar advanced by those drafts; then --spec-draft-p-min on the row as edited.
    `DraftSteer()` edits nothing: the plain argmax."""

    def __init__(
        self, edits: Optional[RowEdits] = None, history: Sequence[int] = (), grammar: Optional[lx.Grammar] = None
    ):
        self.edits = edits if edits is not None and edits.active else None
        self.grammar = grammar
        n = edits.last_n if edits is not None and edits.penalty is not None else 0
        self.window: Optional[deque[int]] = deque(history[-n:], maxlen=n) if n else None

    def pick(self, row: np.ndarray, p_min: float, probe: ConfidenceProbe) -> Optional[int]:
        """The draft token of `row` (edited in place), or None: its top probability is below p_min,
        or the grammar allows no token of it."""
        if self.edits is not None:
            self.edits.edit(row, self.window or ())
        tok, g = int(row.argmax()), self.grammar
        if g is not None and not g.allows(tok):
            try:
                g.mask(row)
            except lx.LlamaError:
                return None
            tok = int(row.argmax())
        if p_min > 0.0 and probe.top_prob(row) < p_min:
            return None
        if g is not None:
            g.accept(tok)
        if self.window is not None:
            self.window.append(tok)
        return tok


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
    return verify_in_order(lambda i: sampler.sample(ctx, i, rows[i]), drafts)


def verify_in_order(pick: Callable[[int], int], drafts: Sequence[int]) -> tuple[int, int]:
    """(n_accepted, next token): choose row 0, 1, ... in order (`pick`) and keep a draft token only
    while it equals the choice (what plain decoding would have chosen there)."""
    k, a = len(drafts), 0
    while True:
        s = pick(a)
        if a < k and s == drafts[a]:
            a += 1
            continue
        return a, s


VerifySampled = Callable[["TokenSampler", lx.Context, np.ndarray, Sequence[int]], tuple[int, int]]
Probs = tuple[float, tuple[tuple[int, float], ...]]  # (log-probability, the top alternatives')


class Chooser:
    """How the target's token at each verified position is chosen, for one generation: the row
    edits, then the grammar (GenConfig.grammar: one state, advanced by every chosen token, which is
    every emitted one: a row is chosen only after the rows before it agreed with their drafts), then
    greedy argmax or llama.cpp's sampler chain; with GenConfig.logprobs, `probs` holds each chosen
    token's log-probability, in order, for the last `first`/`verify`."""

    def __init__(self, model: lx.Model, cfg: GenConfig, eog_tokens: Sequence[int], verify_sampled: VerifySampled):
        self.sampler = TokenSampler(temp=cfg.temp, top_k=cfg.top_k, top_p=cfg.top_p, min_p=cfg.min_p, seed=cfg.seed)
        self.edits = RowEdits(cfg, eog_tokens)
        self.grammar = lx.Grammar(model, cfg.grammar) if cfg.grammar else None
        self.n_top, self.verify_sampled = cfg.logprobs, verify_sampled
        self.post = ChainDist(cfg) if cfg.post_sampling_probs else None
        self.probs: list[Probs] = []
        self._picked: list[Probs] = []  # the grammar path's, as it picks

    def first(self, ctx: lx.Context, index: int, row: np.ndarray, history: Sequence[int]) -> int:
        """The token from the prompt's one output row (batch index `index`)."""
        self.sampler.base = 0
        if self.edits.active:
            self.edits.apply(row[None, :], history)
        tok = self._pick(ctx, index, row) if self.grammar else self.sampler.sample(ctx, index, row)
        self._probs(row[None, :], [tok])
        return tok

    def verify(
        self, ctx: lx.Context, rows: np.ndarray, drafts: Sequence[int], history: Sequence[int], row0: int = 0
    ) -> tuple[int, int]:
        """(drafts accepted, the target's next token) over a verify batch's rows, from batch row `row0`
        on (history: the tokens before row 0, for the penalties)."""
        self.sampler.base = row0
        if self.edits.active:
            self.edits.apply(rows, history, drafts)
        if self.grammar is not None:
            a, nxt = verify_in_order(lambda i: self._pick(ctx, i, rows[i]), drafts)
        elif self.sampler.greedy:
            a, nxt = verify_greedy(rows, drafts)
        else:
            a, nxt = self.verify_sampled(self.sampler, ctx, rows, drafts)
        self._probs(rows, [*drafts[:a], nxt])
        return a, nxt

    def _pick(self, ctx: lx.Context, index: int, row: np.ndarray) -> int:
        """The grammar's choice at a row, which it then accepts (greedy: the argmax if allowed, a
        one-candidate check, else the argmax of the masked row)."""
        g = self.grammar
        assert g is not None
        before = row.copy() if self.n_top is not None else None  # (log-probabilities: the model's, unmasked)
        tok = int(row.argmax()) if self.sampler.greedy else -1
        if tok < 0 or not g.allows(tok):
            g.mask(row)
            tok = self.sampler.sample(ctx, index, row)
        g.accept(tok)
        if before is not None and self.n_top is not None:
            post = self.post  # (the chain's: from the masked row, which it drew from)
            self._picked.append(post.probs(row, tok, self.n_top) if post else log_probs(before, tok, self.n_top))
        return tok

    def _probs(self, rows: np.ndarray, chosen: Sequence[int]) -> None:
        """Each chosen token's log-probability under its row as the edits left it, before the grammar's
        mask (a grammar's picks noted them as they went: the rows are masked in place)."""
        if self.n_top is not None:
            if self.grammar is not None:
                self.probs, self._picked = self._picked, []
            elif self.post is not None:
                self.probs = [self.post.probs(rows[i], t, self.n_top) for i, t in enumerate(chosen)]
            else:
                self.probs = [log_probs(rows[i], t, self.n_top) for i, t in enumerate(chosen)]

    def close(self) -> None:
        self.sampler.close()
        if self.grammar is not None:
            self.grammar.close()


def log_probs(row: np.ndarray, token: int, n_top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """`token`'s log-probability under the row's softmax, and the n_top most likely tokens' (best first)."""
    m = float(row.max())
    lse = m + float(np.log(np.exp(row - m, dtype=np.float64).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if n_top:
        idx = np.argpartition(-row, min(n_top, row.shape[0] - 1))[:n_top]
        idx = idx[np.argsort(-row[idx], kind="stable")]
        top = tuple((int(i), float(row[i]) - lse) for i in idx if np.isfinite(row[i]))  # (a banned token is none)
    return float(row[token]) - lse, top


class ChainDist:
    """The distribution llama.cpp's sampler chain draws from (llama-server's post_sampling_probs):
    top_k, then top_p and min_p on the softmax of what is left, then the temperature; greedy: the
    chosen token, certain. Probabilities come back as logs, like log_probs's."""

    def __init__(self, cfg: GenConfig):
        self.temp, self.top_k, self.top_p, self.min_p = cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p

    def probs(self, row: np.ndarray, token: int, n_top: int) -> Probs:
        if self.temp <= 0.0:
            return 0.0, ((int(token), 0.0),) if n_top else ()
        ids = np.flatnonzero(np.isfinite(row))
        if 0 < self.top_k < len(ids):
            ids = ids[np.argpartition(-row[ids], self.top_k - 1)[: self.top_k]]
        ids = ids[np.argsort(-row[ids], kind="stable")]  # (best first from here on)
        z = row[ids].astype(np.float64)
        if self.top_p < 1.0:
            p = np.exp(z - z[0])
            keep = int(np.searchsorted(np.cumsum(p / p.sum()), self.top_p)) + 1
            ids, z = ids[:keep], z[:keep]
        if self.min_p > 0.0:
            keep = max(1, int(np.sum(z >= z[0] + np.log(self.min_p))))
            ids, z = ids[:keep], z[:keep]
        lp = z / self.temp
        lp = lp - (lp[0] + np.log(np.exp(lp - lp[0]).sum()))
        where = np.flatnonzero(ids == token)
        chosen = float(lp[where[0]]) if len(where) else -math.inf
        return chosen, tuple((int(i), float(x)) for i, x in zip(ids[:n_top], lp[:n_top]))


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


__all__ = [
    "Chooser",
    "Probs",
    "VerifySampled",
    "TokenSampler",
    "RowEdits",
    "DraftSteer",
    "ConfidenceProbe",
    "verify_greedy",
    "verify_sampled",
    "log_probs",
    "ChainDist",
]
