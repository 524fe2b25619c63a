"""What the adaptive controller has seen: decayed acceptance and cost evidence, and the estimates from it.

- cost[N]: seconds per step at N (the steps' wall time minus the time the consumer held the
  generator), a decayed average (per-step decay GAMMA_COST) over windows of steps at that N;
- acc[i]: P(the first i+1 drafts are accepted | drafted), decayed counts (GAMMA_ACC) plus
  PRIOR_WEIGHT pseudo-counts of the geometric continuation from i-1 (of 0 at i = 0: drafting is
  switched on by evidence only);
- E(N) = 1 + sum_{i<N} acc[i] tokens per step; throughput(N) = E(N) / cost[N].

Optimistic estimates, for probing: acceptance upper bounds (A+1)/(D+1), which grow back as evidence
decays (continued geometrically past positions without evidence); for an unmeasured N a cost
interpolated between the measured N on either side (a step's cost grows with N, by less per N the
more N there are over RPC), else extrapolated at half the measured slope (or shaped by given
relative costs), for a measured one its cost less COST_DOUBT / sqrt(steps measured); `promising`,
the N they make worth a probe. Pessimistic, for switching (`judged`): a drafting N above the best
with DEEP_DOUBT misses more than seen at the positions only it drafts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

GAMMA_ACC = 0.99  # per step: acceptance evidence halves in ~69 steps
GAMMA_COST = 0.998  # per step: cost evidence halves in ~350 steps
MIN_WEIGHT = 0.5  # cost evidence (decayed steps) below which a setting counts as unmeasured
PRIOR_WEIGHT = 0.5  # pseudo-observations behind the acceptance point estimates
SLOPE_OPTIMISM = 0.5  # unmeasured N: cost extrapolated at this fraction of the measured slope
# a cost measured over C steps may read up to COST_DOUBT / sqrt(C) too dear (over RPC, 2 servers: one
# probe's 3 timed steps at N = 1 and 2 read them dear and kept drafting off for 300 steps; 1.17-1.23x)
COST_DOUBT = 0.3
# a drafting N replaces a smaller one judged with one miss more than seen at the positions only it drafts: a
# probe's few steps see them (over RPC one 3-step probe of N = 3 at a run of easy text took its third draft
# from 53% to 70% right, and N = 3, 3-4% slower there than N = 2, replaced it for good)
DEEP_DOUBT = 1.0
PROBE_MARGIN = 1.02  # a probe's optimistic throughput must beat the best's estimate by this


class Evidence:
    """Decayed counts for N = 0..n_max. costs: relative step costs by N; with measure=False they are
    the costs (nothing is measured); with measure=True they only shape unmeasured settings."""

    def __init__(self, n_max: int, costs: Optional[Sequence[float]], measure: bool):
        L = n_max + 1
        self.n_max = n_max
        self.costs = [float(c) for c in costs[:L]] if costs is not None else None
        self.measure = measure
        self.S = [0.0] * L  # decayed sum of step seconds by N
        self.C = [0.0] * L  # decayed step counts by N
        self.D = [0.0] * n_max  # decayed counts: draft position i was drafted
        self.A = [0.0] * n_max  # ... and accepted

    # -- adding evidence -------------------------------------------------------------------------

    def fold(self, nk: Sequence[int], na: Sequence[int]) -> None:
        """Add a window's steps by drafted count k (nk[k]) and accepted count a (na[a])."""
        c = 0
        for k in range(self.n_max, 0, -1):
            c += nk[k]
            self.D[k - 1] += c
        c = 0
        for j in range(self.n_max, 0, -1):
            c += na[j]
            self.A[j - 1] += c

    def decay_acceptance(self, steps: int) -> None:
        g = GAMMA_ACC**steps
        for i in range(self.n_max):
            self.D[i] *= g
            self.A[i] *= g

    def add_cost(self, n: int, per: float, steps: int) -> None:
        """`steps` steps at N = n took `per` seconds each."""
        S, C = self.S, self.C
        if C[n] >= MIN_WEIGHT:
            per = min(per, 3.0 * S[n] / C[n])  # a preempted step is not the setting's cost
        g = GAMMA_COST**steps
        for i in range(len(S)):
            S[i] *= g
            C[i] *= g
        S[n] += per * steps
        C[n] += steps

    # -- estimates ---------------------------------------------------------------------------------

    def hit_rate(self, doubt: float = 0.0) -> Optional[float]:
        """The head's first-draft acceptance so far (None before any evidence); `doubt`: misses
        added to what was seen (a decision on a few drafts)."""
        return self.A[0] / (self.D[0] + doubt) if self.D[0] > 0.0 else None

    def cost(self, n: int) -> Optional[float]:
        """Measured seconds (or relative units, with measure=False) per step at N, or None."""
        if not self.measure:
            return self.costs[n]  # type: ignore[index]  # measure=False comes with costs
        return self.S[n] / self.C[n] if self.C[n] >= MIN_WEIGHT else None

    def acceptance(self, doubt_from: Optional[int] = None) -> list[float]:
        """Point estimates of P(first i+1 drafts accepted), i = 0..n_max-1; from position doubt_from on,
        one miss more than seen (DEEP_DOUBT)."""
        out = []
        prev2, prev = 1.0, 1.0
        for i in range(self.n_max):
            extra = 0.0 if i == 0 else (min(prev, prev * prev / prev2) if prev2 > 0 else 0.0)
            miss = DEEP_DOUBT if doubt_from is not None and i >= doubt_from else 0.0
            p = min((self.A[i] + PRIOR_WEIGHT * extra) / (self.D[i] + PRIOR_WEIGHT + miss), prev)
            out.append(p)
            prev2, prev = prev, p
        return out

    def acceptance_upper(self) -> list[float]:
        """Optimistic P(first i+1 drafts accepted): (A+1)/(D+1) where position i has evidence,
        else the geometric continuation u[i-1] * u[0]."""
        out: list[float] = []
        prev = 1.0
        for i in range(self.n_max):
            u = (self.A[i] + 1.0) / (self.D[i] + 1.0)
            if i and self.D[i] < MIN_WEIGHT:
                u = prev * out[0]
            u = min(prev, u)
            out.append(u)
            prev = u
        return out

    def throughput(self) -> list[Optional[float]]:
        """Estimated tokens per unit of cost at each N (None: not measured)."""
        acc = self.acceptance()
        out: list[Optional[float]] = []
        e = 1.0
        for n in range(self.n_max + 1):
            if n:
                e += acc[n - 1]
            c = self.cost(n)
            out.append(e / c if c else None)
        return out

    def judged(self, thr: Sequence[Optional[float]], best: int) -> list[Optional[float]]:
        """thr as the best's rivals are judged: a drafting N above the best with DEEP_DOUBT at the
        positions only it drafts."""
        if not best:
            return list(thr)
        acc, doubted = self.acceptance(), self.acceptance(doubt_from=best)
        e, e_doubted, out = 1.0 + sum(acc[:best]), 1.0 + sum(doubted[:best]), list(thr)
        for n in range(best + 1, len(thr)):
            e, e_doubted = e + acc[n - 1], e_doubted + doubted[n - 1]
            t = thr[n]
            out[n] = t * e_doubted / e if t is not None else None
        return out

    def promising(self, thr: Sequence[Optional[float]], best: int, climbed: int) -> Optional[int]:
        """The N to probe: the highest optimistic throughput, if that beats the best's estimate by
        PROBE_MARGIN (an unmeasured N = 0 first: its cost is the baseline), climbing: at most one past
        the largest N probed so far (`climbed`, not decayed: probes can be hundreds of steps apart), or
        the smallest N that could win if that is further. A few shadow hits put every bound at 1, and
        a first probe at N = 8 that loses makes the next one wait."""
        measured = [self.cost(n) for n in range(self.n_max + 1)]
        up = self.acceptance_upper()
        top = (thr[best] or 0.0) * PROBE_MARGIN
        e, wins = 1.0, []
        for n in range(self.n_max + 1):
            if n:
                e += up[n - 1]
            if n == best:
                continue
            c = self.cost_optimistic(n, measured)
            if c <= 0.0:
                return n
            if e / c > top:
                wins.append((n, e / c))
        cap = max(climbed + 1, wins[0][0]) if wins else 0
        return max((w for w in wins if w[0] <= cap), key=lambda w: w[1])[0] if wins else None

    def doubt(self, n: int, more: float = 0.0) -> float:
        """The share of N's measured cost it may really be: 1 - COST_DOUBT / sqrt(steps measured, and
        `more` about to be), at least a half."""
        return max(0.5, 1.0 - COST_DOUBT / math.sqrt(max(self.C[n] + more, 1.0)))

    def cost_optimistic(self, n: int, measured: Sequence[Optional[float]]) -> float:
        c = measured[n]
        if c is not None and self.measure:  # (a probe's few steps may have read it dear: another look)
            return c * self.doubt(n)
        if c is not None:
            return c
        below = [(j, m) for j, m in enumerate(measured[:n]) if m is not None]
        if not below:
            return 0.0  # never measured and nothing cheaper known: worth a look
        j1, c1 = below[-1]
        if self.costs is not None:  # a cost model's shape
            return c1 * self.costs[n] / max(self.costs[j1], 1e-12)
        above = next(((j, m) for j, m in enumerate(measured) if j > n and m is not None), None)
        if above is not None:  # (over RPC N = 1 read 1.8x plain and N = 2 2.2x: a line from plain said 1.1x)
            j2, c2 = above
            return c1 + (c2 - c1) * (n - j1) / (j2 - j1)
        if len(below) >= 2:
            j0, c0 = below[-2]
            return c1 + SLOPE_OPTIMISM * max((c1 - c0) / (j1 - j0), 0.0) * (n - j1)
        return c1 * (1.0 + 0.1 * (n - j1))


__all__ = [
    "Evidence",
    "COST_DOUBT",
    "DEEP_DOUBT",
    "GAMMA_ACC",
    "GAMMA_COST",
    "MIN_WEIGHT",
    "PRIOR_WEIGHT",
    "PROBE_MARGIN",
    "SLOPE_OPTIMISM",
]
