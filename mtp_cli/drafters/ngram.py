"""Prompt lookup: the longest recent n-gram that occurred before proposes what followed it."""

from __future__ import annotations

from collections.abc import Sequence

from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import Drafter
from mtp_cli.errors import ConfigError


class NgramDrafter(Drafter):
    """Drafting over prompt + generated tokens, O(1) per step: an index maps each n-gram (n in
    ngram_min..ngram_max, ending with id_last) to where its most recent earlier occurrence continued."""

    name = "ngram"
    aliases = ("ngram-simple",)
    summary = "prompt lookup (n-grams of the prompt and the text so far)"
    order = 3

    def __init__(self, ngram_min: int = 2, ngram_max: int = 4):
        super().__init__()
        self.ngram_min = int(ngram_min)
        self.ngram_max = int(ngram_max)
        self.hist: list[int] = []
        self.index: dict[int, dict[tuple[int, ...], int]] = {}

    @classmethod
    def check_config(cls, cfg: GenConfig) -> None:
        if not 1 <= cfg.ngram_min <= cfg.ngram_max:
            raise ConfigError(
                f"n-gram sizes must satisfy 1 <= `ngram_min` <= `ngram_max`, got {cfg.ngram_min}..{cfg.ngram_max}"
            )

    def configure(self, cfg: GenConfig) -> None:
        self.ngram_min, self.ngram_max = cfg.ngram_min, cfg.ngram_max

    can_resume = True

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool, rewound: bool) -> None:
        self.begin(prompt)  # (its index is rebuilt from the whole prompt: no context to keep)

    def begin(self, prompt: Sequence[int]) -> None:
        self.hist = []
        self.index = {n: {} for n in range(self.ngram_min, self.ngram_max + 1)}
        for t in prompt:
            self._push(int(t))

    def _push(self, tok: int) -> None:
        h = self.hist
        j = len(h)  # index of the new token: register the n-grams that end right before it
        h.append(tok)
        for n, idx in self.index.items():
            if j >= n:
                idx[tuple(h[j - n : j])] = j

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        self._push(int(id_last))  # id_last is final: it is part of the history from now on
        if n_max <= 0:
            return []
        h = self.hist
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(h) <= n:
                continue
            start = self.index[n].get(tuple(h[-n:]))
            if start is None:
                continue
            out: list[int] = []
            L = len(h)
            for k in range(n_max):  # copy what followed, overlapping into the draft itself (LZ77-style)
                i = start + k
                out.append(h[i] if i < L else out[i - L])
            return out
        return []

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        for t in drafts[:n_accepted]:
            self._push(int(t))
