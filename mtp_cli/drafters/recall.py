"""Recall: the prompt's last rows an MTP head re-reads when it wakes.

A head put to sleep (drafting off) restarts cold: its memory starts over at the current position,
and with no history to attend over its first drafts are poor, so the probes that decide whether it
drafts at all judge it low. Over RPC the demo head's first draft was right 91% of the time kept in
step and 56-62% in adaptive's probes, which kept a 1.15x setting off. The prompt's own rows (each
token with the target's h row of the position before it) cost the target one h-row read per prompt
chunk that reaches them: a head remembers the last RECALL_ROWS of them, asleep or awake, and re-reads them on waking,
placed just below the position it wakes at (llama.cpp wants a sequence's positions consecutive), as
if the text generated while it slept were not there. Draft quality only: drafts are verified.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# prompt rows a head re-reads on waking: one head-layer decode of this many rows per wake (16 eval
# prompts, 2 drafts after an 8-step warm-up: first draft 0.54 -> 0.67, both 0.29 -> 0.44)
RECALL_ROWS = 256


class Recall:
    """The last RECALL_ROWS (token, h row of the position before it) pairs of a prompt, by position."""

    def __init__(self, n_embd: int, n_rows: int = RECALL_ROWS):
        self.n_rows = int(n_rows)
        self.tokens = np.zeros(0, dtype=np.int32)
        self.h = np.zeros((0, int(n_embd)), dtype=np.float32)  # row i: the target's h of the position before token i
        self.h_end = np.zeros(int(n_embd), dtype=np.float32)  # the target's h of end-1: the next token's pair
        self.end = 0  # the position after the last row held

    def clear(self) -> None:
        self.tokens, self.h, self.end = self.tokens[:0], self.h[:0], 0
        self.h_end[:] = 0.0

    def cut(self, keep: int) -> None:
        """Drop the rows at positions keep.. (a rewound prompt; those below stay the same text)."""
        drop = self.end - max(int(keep), 0)
        if drop >= len(self.tokens):
            self.clear()
        elif drop > 0:
            np.copyto(self.h_end, self.h[len(self.h) - drop])  # (the first dropped row's pair: keep-1's)
            self.tokens, self.h, self.end = self.tokens[:-drop], self.h[:-drop], self.end - drop

    def add(self, tokens: Sequence[int] | np.ndarray, h: np.ndarray, pos0: int) -> None:
        """A prompt chunk at pos0.. with the target's h rows of the same positions: each token is kept
        with the h row of the position before it (the first with the last chunk's last, or zeros where
        the chunk does not continue what is held, which it then replaces)."""
        if pos0 != self.end or pos0 == 0:
            self.clear()
        n, k = len(tokens), self.n_rows
        pairs = h[n - 1 - k : n - 1] if n > k else np.concatenate([self.h_end[None, :], h[: n - 1]])
        self.tokens = np.concatenate([self.tokens, np.asarray(tokens[-k:], dtype=np.int32)])[-k:]
        self.h = np.concatenate([self.h, np.asarray(pairs, dtype=np.float32)])[-k:]
        np.copyto(self.h_end, h[n - 1])
        self.end = int(pos0) + n

    def below(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows to re-read at positions pos-k..pos-1 (at most pos of them)."""
        k = min(len(self.tokens), max(int(pos), 0))
        return self.tokens[len(self.tokens) - k :], self.h[len(self.h) - k :]


__all__ = ["Recall", "RECALL_ROWS"]
