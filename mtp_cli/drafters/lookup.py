"""Text lookup: drafts copied from where the text so far (prompt and output) last said what it says
now, as long as the match and its track record make them worth verifying on this machine.

Per step: the longest match of the text's end with an earlier place (every earlier occurrence of its
last `ngram_min` tokens among the most recent CANDIDATES, extended backwards up to MATCH_CAP
tokens), and what followed it there. The copy's first token is kept with probability p, each later
one (the one before it kept) with probability alpha: the track record of copies from matches of that
length and source (decayed counts of kept and failed tokens, first and later apart, per doubling of
the match length, copies of the prompt and of the output apart), starting from Laplace's rule of
succession (after L agreeing tokens the next agrees with probability (L+1)/(L+2)). A copy ends
before an end-of-generation token: nothing after one is ever generated, and the target gives it as
its own next token anyway (a prompt's template suffix after a quoted block would otherwise be
drafted long, and wrong). The first token is the risky one: where a short match goes wrong it goes
wrong at once, and a copy that started right tends to go on. Where the copy comes from matters as
much: in edit work the prompt holds the text being copied, while a short match in the model's own
output is its phrasing coming round again (a list of the changes made, say); on the edit prompts
such a copy's first token failed 63% of the time, against 26% for a short match in the prompt. The
draft length d maximizes the tokens a verify pass then gives, 1 + p (1 + alpha + ... + alpha^(d-1)),
over what it costs, v(d) (mtp_cli.step_costs: measured here); no draft unless that beats a plain
step. So a long verbatim run drafts long, a short or unreliable match drafts little or nothing, and
a step with no match costs a dict look-up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Optional

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import ContextPlan, Drafter, Models
from mtp_cli.errors import ConfigError
from mtp_cli.step_costs import StepCosts

CANDIDATES = 8  # earlier occurrences of the key looked at (the most recent)
MATCH_CAP = 64  # tokens a match is extended backwards at most
BUCKETS = 6  # track records by match length: [2,4), [4,8), ... [64, ...); for each source (prompt, output)
PRIOR_WEIGHT = 4.0  # pseudo-counts of the prior per bucket
DECAY = 0.98  # a bucket's counts shrink by this at each of its new records: the workload changes
# a draft must promise this much more than a plain step: its real cost has what v(d) leaves out (a
# new batch shape rebuilds llama.cpp's graph, a big batch cools the caches for the next plain step;
# benchmarks/lookup_sim.py: 1.1 did best among 1.02 / 1.1 / 1.2 on the edit prompts)
MARGIN = 1.1


class LookupDrafter(Drafter):
    """Text lookup with a draft length from the match and its track record (module docstring)."""

    name = "lookup"
    aliases = ("ngram-mod", "ngram-map-k")
    summary = "text lookup: copies from the prompt and output, as long as the match says"
    order = 4
    can_resume = True
    self_sized = True

    def __init__(self, costs: Optional[StepCosts] = None, key: int = 2, stop: Iterable[int] = ()):
        super().__init__()
        self.costs = costs if costs is not None else StepCosts()
        self.key = int(key)
        self.stop = frozenset(int(t) for t in stop)  # a copy ends before these (end of generation)
        self.hist: list[int] = []
        self.index: dict[tuple[int, ...], deque[int]] = {}
        b = [1 << i for i in range(1, BUCKETS + 1)] * 2  # each bucket's shortest match: from the prompt, the output
        # [kept, failed] per bucket: the first token of a copy, and a later one (the one before kept)
        self.first = [[PRIOR_WEIGHT * (L + 1) / (L + 2), PRIOR_WEIGHT / (L + 2)] for L in b]
        self.later = [[PRIOR_WEIGHT * (L + 2) / (L + 3), PRIOR_WEIGHT / (L + 3)] for L in b]
        self.n_prompt = 0  # where the output starts in hist
        self._bucket: Optional[int] = None  # the bucket of this step's draft
        self._proposed: list[int] = []  # its drafts of this step, as it proposed them

    @classmethod
    def check_config(cls, cfg: GenConfig) -> None:
        if cfg.ngram_min < 1:
            raise ConfigError(f"`ngram_min` must be >= 1, got {cfg.ngram_min}")

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> LookupDrafter:
        return cls(plan.costs, stop=lx.eog_tokens(models.target))

    def configure(self, cfg: GenConfig) -> None:
        self.key = cfg.ngram_min

    def begin(self, prompt: Sequence[int]) -> None:
        self.hist, self.index = [], {}
        for t in prompt:
            self._push(int(t))
        self.n_prompt = len(self.hist)

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

    def record(self, length: int, start: int) -> int:
        """The track record of a copy from a match of this length whose copy starts at hist[start]."""
        return bucket(length) + (BUCKETS if start >= self.n_prompt else 0)

    def odds(self, length: int, start: int) -> tuple[float, float]:
        """(p, alpha) for a copy from a match of this length, starting at hist[start]: its first token
        kept, a later one kept."""
        b = self.record(length, start)
        (k1, f1), (k2, f2) = self.first[b], self.later[b]
        return k1 / (k1 + f1), k2 / (k2 + f2)

    def length(self, p_first: float, alpha: float, available: int) -> int:
        """The d in 0..available with the most tokens per pass for its cost; 0 when none beats a plain step."""
        best_d, best = 0, MARGIN
        e, p = 1.0, p_first
        for d in range(1, available + 1):
            e += p
            p *= alpha
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
            t = h[j] if j < n else out[j - n]
            if t in self.stop:
                break
            out.append(t)
        d = self.length(*self.odds(L, start), len(out))
        if d:
            self._bucket, self._proposed = self.record(L, start), out[:d]
        return out[:d]

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        b = self._bucket
        if b is not None and list(drafts) == self._proposed:  # (its own, not discarded or another's)
            _record(self.first[b], kept=float(n_accepted > 0), failed=n_accepted == 0)
            if n_accepted and len(drafts) > 1:
                _record(self.later[b], kept=float(n_accepted - 1), failed=n_accepted < len(drafts))
            self._bucket = None
        for t in drafts[:n_accepted]:
            self._push(int(t))


def _record(counts: list[float], *, kept: float, failed: bool) -> None:
    """Decay a [kept, failed] pair and add what one draft did."""
    counts[0] = counts[0] * DECAY + kept
    counts[1] = counts[1] * DECAY + failed


def bucket(length: int) -> int:
    return max(0, min(BUCKETS - 1, length.bit_length() - 2))


__all__ = ["LookupDrafter", "bucket"]
