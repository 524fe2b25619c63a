"""Recall: the prompt's last rows an MTP head re-reads when it wakes.

A head put to sleep (drafting off) restarts cold: its memory starts over at the current position,
and with no history to attend over its first drafts are poor, so the probes that decide whether it
drafts at all judge it low. Over RPC the demo head's first draft was right 91% of the time kept in
step and 56-62% in adaptive's probes, which kept a 1.15x setting off. The prompt's own rows (each
token with the target's h row of the position before it) cost the target one h-row read per prompt
chunk: a head remembers the last RECALL_ROWS of them, asleep or awake, and re-reads them on waking,
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
        self.h = np.zeros((0, int(n_embd)), dtype=np.float32)
        self.end = 0  # the position after the last row held

    def clear(self) -> None:
        self.tokens, self.h, self.end = self.tokens[:0], self.h[:0], 0

    def cut(self, keep: int) -> None:
        """Drop the rows at positions keep.. (a rewound prompt; those below stay the same text)."""
        drop = max(0, self.end - max(int(keep), 0))
        if drop >= len(self.tokens):
            self.clear()
        elif drop:
            self.tokens, self.h, self.end = self.tokens[:-drop], self.h[:-drop], self.end - drop

    def add(self, tokens: Sequence[int] | np.ndarray, h: np.ndarray, pos0: int) -> None:
        """tokens at pos0.. with the h rows they pair with (row k: the target's h of pos0+k-1); a
        chunk that does not continue what is held replaces it."""
        if pos0 != self.end:
            self.clear()
        k = self.n_rows
        self.tokens = np.concatenate([self.tokens, np.asarray(tokens[-k:], dtype=np.int32)])[-k:]
        self.h = np.concatenate([self.h, np.asarray(h[-k:], dtype=np.float32)])[-k:]
        self.end = int(pos0) + len(tokens)

    def below(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows to re-read at positions pos-k..pos-1 (at most pos of them)."""
        k = min(len(self.tokens), max(int(pos), 0))
        return self.tokens[len(self.tokens) - k :], self.h[len(self.h) - k :]


__all__ = ["Recall", "RECALL_ROWS"]
