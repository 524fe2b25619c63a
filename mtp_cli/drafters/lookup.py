"""Text lookup: drafts copied from where the text so far (prompt and output) last said what it says
now, as long as the match and its track record make them worth verifying on this machine.

Per step: the longest match of the text's end with an earlier place (every earlier occurrence of
its last `ngram_min` tokens among the most recent CANDIDATES, extended backwards up to MATCH_CAP
tokens), and what followed it there. Each token of such a copy is assumed kept with probability
alpha, the track record of copies from matches of that length (decayed counts of kept and failed
draft tokens per doubling of the match length, starting from Laplace's rule of succession: after
L agreeing tokens the next agrees with probability (L+1)/(L+2)). The draft length d maximizes the
tokens a verify pass then gives, sum_{i<=d} alpha^i, over what it costs, v(d) (mtp_cli.step_costs:
measured here); no draft unless that beats a plain step. So a long verbatim run drafts long, a
short or unreliable match drafts little or nothing, and a step with no match costs a dict look-up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Optional

from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import ContextPlan, Drafter, Models
from mtp_cli.errors import ConfigError
from mtp_cli.step_costs import StepCosts

CANDIDATES = 8  # earlier occurrences of the key looked at (the most recent)
MATCH_CAP = 64  # tokens a match is extended backwards at most
BUCKETS = 6  # track records by match length: [2,4), [4,8), ... [64, ...)
PRIOR_WEIGHT = 4.0  # pseudo-counts of the prior per bucket
DECAY = 0.98  # a bucket's counts shrink by this at each of its new records: the workload changes
MARGIN = 1.02  # a draft must promise this much more than a plain step


class LookupDrafter(Drafter):
    """Text lookup with a draft length from the match and its track record (module docstring)."""

    name = "lookup"
    aliases = ("ngram-mod", "ngram-map-k")
    summary = "text lookup: copies from the prompt and output, as long as the match says"
    order = 4
    can_resume = True
    self_sized = True

    def __init__(self, costs: Optional[StepCosts] = None, key: int = 2):
        super().__init__()
        self.costs = costs if costs is not None else StepCosts()
        self.key = int(key)
        self.hist: list[int] = []
        self.index: dict[tuple[int, ...], deque[int]] = {}
        b = [1 << i for i in range(1, BUCKETS + 1)]  # each bucket's shortest match
        self.kept = [PRIOR_WEIGHT * (L + 1) / (L + 2) for L in b]
        self.failed = [PRIOR_WEIGHT / (L + 2) for L in b]
        self._bucket: Optional[int] = None  # the bucket of this step's draft

    @classmethod
    def check_config(cls, cfg: GenConfig) -> None:
        if cfg.ngram_min < 1:
            raise ConfigError(f"`ngram_min` must be >= 1, got {cfg.ngram_min}")

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> LookupDrafter:
        return cls(plan.costs)

    def configure(self, cfg: GenConfig) -> None:
        self.key = cfg.ngram_min

    def begin(self, prompt: Sequence[int]) -> None:
        self.hist, self.index = [], {}
        for t in prompt:
            self._push(int(t))

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool, rewound: bool) -> None:
        self.begin(prompt)  # (the index is the prompt's: rebuilt, the track record kept)

    def _push(self, tok: int) -> None:
        h, k = self.hist, self.key
        j = len(h)  # the new token's index: the key ending right before it continues here
        h.append(tok)
        if j >= k:
            occ = self.index.get(key := tuple(h[j - k : j]))
            if occ is None:
                occ = self.index[key] = deque(maxlen=CANDIDATES)
            occ.append(j)

    def match(self) -> tuple[int, int]:
        """(L, start): the longest match of the text's end with an earlier place, and where what
        followed it starts; (0, -1) when there is none."""
        h, k = self.hist, self.key
        n = len(h)
        occ = self.index.get(tuple(h[n - k :])) if n > k else None
        best_len, best = 0, -1
        for start in reversed(occ or ()):  # (most recent first: it wins ties)
            L = k
            while L < MATCH_CAP and start - L - 1 >= 0 and h[start - L - 1] == h[n - L - 1]:
                L += 1
            if L > best_len:
                best_len, best = L, start
        return best_len, best

    def alpha(self, length: int) -> float:
        b = bucket(length)
        return self.kept[b] / (self.kept[b] + self.failed[b])

    def length(self, alpha: float, available: int) -> int:
        """The d in 0..available with the most tokens per pass for its cost; 0 when none beats a plain step."""
        best_d, best = 0, MARGIN
        e, p = 1.0, 1.0
        for d in range(1, available + 1):
            p *= alpha
            e += p
            r = e / self.costs.v(d)
            if r > best:
                best_d, best = d, r
        return best_d

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        self._push(int(id_last))
        self._bucket = None
        if n_max <= 0:
            return []
        L, start = self.match()
        if start < 0:
            return []
        h = self.hist
        out: list[int] = []
        n = len(h)
        for i in range(n_max):  # what followed, overlapping into the draft itself (LZ77-style)
            j = start + i
            out.append(h[j] if j < n else out[j - n])
        d = self.length(self.alpha(L), len(out))
        if d:
            self._bucket = bucket(L)
        return out[:d]

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        b = self._bucket
        if b is not None and drafts:
            self.kept[b] = self.kept[b] * DECAY + n_accepted
            self.failed[b] = self.failed[b] * DECAY + (n_accepted < len(drafts))
            self._bucket = None
        for t in drafts[:n_accepted]:
            self._push(int(t))


def bucket(length: int) -> int:
    return max(0, min(BUCKETS - 1, length.bit_length() - 2))


__all__ = ["LookupDrafter", "bucket"]
