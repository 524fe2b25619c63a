"""What a verify pass costs on this machine, learned from the loop's own decodes (ARCHITECTURE §6).

v(k) = the seconds of a target decode of k drafts + 1 token over those of a plain step (k = 0), as
decayed means of what the verify loop measured; a drafter that chooses its own length (the text
lookup) weighs the tokens a draft would give against v(k). Unmeasured k are interpolated between
measured ones and extrapolated past the largest with the slope of the last two (PRIOR's before
anything is measured: a 2-core x86 CPU's curve, where verification is dear, so a drafter starts
cautious and measures its way to cheaper verification on a GPU).
"""

from __future__ import annotations

from bisect import bisect_left

# v(k) = PRIOR_FIRST + PRIOR_SLOPE k for k >= 1 before measurements (the demo model on 2 vCPUs,
# flash attention off, 100-400 positions: v(1), v(2), v(4), v(8), v(16) = 1.6-1.7, 1.7-1.9, 2.1-2.2,
# 2.8, 4.4)
PRIOR_FIRST, PRIOR_SLOPE = 1.45, 0.19
COLD = 1.5  # a first pass of k dearer than this times what was expected of it is a cold one
DECAY = 0.1  # weight of a new measurement in its k's mean (recent costs matter: the context grows)


class StepCosts:
    """Decayed mean seconds of verify passes by drafts k; `v(k)` relative to a plain step."""

    def __init__(self) -> None:
        self._t: dict[int, float] = {}  # k -> decayed mean seconds
        self._ks: list[int] = []  # measured k >= 1, sorted
        self._tried: set[int] = set()  # k passed once at least

    def observe(self, k: int, seconds: float) -> None:
        if seconds <= 0.0:
            return
        if k not in self._tried:  # a first pass of a new shape may be cold (a graph built, captured)
            self._tried.add(k)
            t0 = self._t.get(0)
            if k > 0 and t0 is not None and seconds > COLD * self.v(k) * t0:
                return  # (not taken as its cost: that would keep k from being drafted, and measured, again)
        old = self._t.get(k)
        self._t[k] = seconds if old is None else old + DECAY * (seconds - old)
        if old is None and k > 0:
            self._ks.insert(bisect_left(self._ks, k), k)

    def v(self, k: int) -> float:
        """A verify pass of k drafts relative to a plain step (1 at k = 0)."""
        if k <= 0:
            return 1.0
        t0 = self._t.get(0)
        ks = self._ks
        if t0 is None or not ks:
            return PRIOR_FIRST + PRIOR_SLOPE * k
        if k in self._t:
            return self._t[k] / t0
        i = bisect_left(ks, k)
        if 0 < i < len(ks):  # between two measured
            lo, hi = ks[i - 1], ks[i]
            return (self._t[lo] + (self._t[hi] - self._t[lo]) * (k - lo) / (hi - lo)) / t0
        if i == 0:  # below the smallest measured: toward the prior's first step
            hi = ks[0]
            return min(self._t[hi] / t0, PRIOR_FIRST + PRIOR_SLOPE * k)
        last = ks[-1]
        slope = (self._t[last] - self._t[ks[-2]]) / (last - ks[-2]) / t0 if len(ks) > 1 else PRIOR_SLOPE
        return self._t[last] / t0 + max(0.0, slope) * (k - last)

    def measured(self) -> dict[int, float]:
        """v(k) for every measured k (reports, tests)."""
        t0 = self._t.get(0)
        return {k: t / t0 for k, t in sorted(self._t.items())} if t0 else {}


__all__ = ["StepCosts", "PRIOR_FIRST", "PRIOR_SLOPE"]
