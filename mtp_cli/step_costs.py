"""What a verify pass costs on this machine, learned from the loop's own decodes (ARCHITECTURE §6).

v(k) = the seconds of a target decode of k + 1 rows (k drafts and the last token, or several
sequences' rows: mtp_cli.slots) over those of a plain step (k = 0); a
drafter that chooses its own length (the text lookup) weighs the tokens a draft would give against
v(k). Each k's passes are kept as a decayed mean; v(k) for k >= 1 is the line a + b k fitted to
those means by weighted least squares (a k's weight: how often it was measured, capped), with two
pseudo-measurements of PRIOR's line (a 2-core x86 CPU's, where verification is dear: a drafter starts
cautious and measures its way to cheaper verification on a GPU). One line, not each k's own mean: a
few noisy passes of one length (a pass that rebuilt llama.cpp's graph, a busy neighbour) must not
make the lengths past it look dear forever, since a length never drafted is never measured again.
A plain step right after a verify pass rebuilds llama.cpp's graph (it keeps the last shape's only):
what it costs over a plain step is the pass's, not plain decoding's.
"""

from __future__ import annotations

from typing import Optional

# v(k) = PRIOR_FIRST + PRIOR_SLOPE k for k >= 1 before measurements (the demo model on 2 vCPUs,
# flash attention off, 100-400 positions: v(1), v(2), v(4), v(8), v(16) = 1.6-2.1, 1.7-2.3, 2.1-2.6,
# 2.8-3.3, 4.4-5.2)
PRIOR_FIRST, PRIOR_SLOPE = 1.45, 0.19
PRIOR_AT = (1, 16)  # where the prior's pseudo-measurements sit (one weight each)
WEIGHT_CAP = 16  # a k's weight in the fit at most: its passes' count
COLD = 1.5  # a first pass of k dearer than this times what was expected of it is a cold one
KNOWN = 4  # passes of one k >= 1 after which the fit is taken as measured (known())
DECAY = 0.1  # weight of a new measurement in its k's mean (recent costs matter: the context grows)


class StepCosts:
    """Decayed mean seconds of verify passes by drafts k; `v(k)` relative to a plain step."""

    def __init__(self) -> None:
        self._t: dict[int, float] = {}  # k -> decayed mean seconds
        self._n: dict[int, int] = {}  # k -> passes measured (capped)
        self._tried: set[int] = set()  # k passed once at least
        self._line: Optional[tuple[float, float]] = None  # (a, b) of the fit, until the next observe
        self._last = 0  # the k observed last

    def observe(self, k: int, seconds: float) -> None:
        if seconds <= 0.0:
            return
        last, self._last = self._last, k
        t0 = self._t.get(0)
        if k == 0 and last > 0 and t0 is not None and last in self._t:  # (the pass's graph, undone)
            extra = max(0.0, seconds - t0)
            self._t[last] += extra if self._n[last] == 1 else DECAY * extra
            self._line = None
            return
        if k not in self._tried:  # a first pass of a new shape may be cold (a graph built, captured)
            self._tried.add(k)
            if k > 0 and t0 is not None and seconds > COLD * self.v(k) * t0:
                return  # (not taken as its cost: that would keep k from being drafted, and measured, again)
        old = self._t.get(k)
        self._t[k] = seconds if old is None else old + DECAY * (seconds - old)
        self._n[k] = min(self._n.get(k, 0) + 1, WEIGHT_CAP)
        self._line = None

    def unobserved(self) -> None:
        """A decode this does not see ran (a prompt's): the next pass follows it, not the last one seen."""
        self._last = 0

    def v(self, k: int) -> float:
        """A verify pass of k drafts relative to a plain step (1 at k = 0)."""
        if k <= 0:
            return 1.0
        if self._line is None:
            self._line = self._fit()
        a, b = self._line
        return a + b * k

    def _fit(self) -> tuple[float, float]:
        """(a, b): weighted least squares over the measured k >= 1 and the prior's points; b >= 0."""
        t0 = self._t.get(0)
        pts = [(float(k), PRIOR_FIRST + PRIOR_SLOPE * k, 1.0) for k in PRIOR_AT]
        if t0:
            pts += [(float(k), t / t0, float(self._n[k])) for k, t in self._t.items() if k > 0]
        sw = sum(w for _, _, w in pts)
        mx = sum(w * x for x, _, w in pts) / sw
        my = sum(w * y for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        b = max(0.0, sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx)
        return my - b * mx, b

    def plain(self) -> Optional[float]:
        """The decayed mean seconds of a plain step (one row), once measured."""
        return self._t.get(0)

    def known(self) -> bool:
        """Whether v is this machine's rather than the prior's: a plain step and some KNOWN passes of
        more rows measured."""
        return 0 in self._t and any(n >= KNOWN for k, n in self._n.items() if k > 0)

    def measured(self) -> dict[int, float]:
        """Each measured k's own mean relative to a plain step (reports, tests)."""
        t0 = self._t.get(0)
        return {k: t / t0 for k, t in sorted(self._t.items())} if t0 else {}


__all__ = ["StepCosts", "PRIOR_FIRST", "PRIOR_SLOPE"]
