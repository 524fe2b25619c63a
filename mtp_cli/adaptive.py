"""Choosing the draft length N while generating, and `--spec-draft-n-max auto`.

AdaptiveController: the verify loop calls `step(k, a, t_consumer)` at the start of each step (k =
tokens the previous step drafted, a = accepted) and drafts at most the N it returns. Per step that
is a few list increments and a counter, and while drafting is off the loop may skip even that
(`quiet`). Every few steps (`_decide`) the controller folds what it saw into running estimates:

- cost[N]: seconds per step at N (the steps' wall time minus the time the consumer held the
  generator), a decayed average (per-step decay GAMMA_COST) over windows of steps at that N;
- acc[i]: P(the first i+1 drafts are accepted | drafted), decayed counts (GAMMA_ACC) plus
  PRIOR_WEIGHT pseudo-counts of the geometric continuation from i-1 (of 0 at i = 0: drafting is
  switched on by evidence only);
- E(N) = 1 + sum_{i<N} acc[i] tokens per step; throughput(N) = E(N) / cost[N].

The rule: N = the measured setting with the highest throughput; N = 0 (plain decoding) when no
drafting setting beats it. Exploration is by probes, at most one per `gap` steps (GAP_MIN, doubling
to GAP_MAX while probes change nothing) and, after a probe that changed nothing, not before its
extra cost is PROBE_BUDGET (0.5%) of the steps since (unless it came within CLOSE_CALL of the best).
A probe runs the N with the highest optimistic throughput -- acceptance upper bounds (A+1)/(D+1),
which grow back as evidence decays (continued geometrically past positions without evidence),
and for an unmeasured N a cost extrapolated at half the measured slope -- if that beats the best;
PROBE_STEPS steps, the first untimed (graph rebuilds, catch-up). While drafting is off and the
head's first-token hit rate is below SHADOW_RATE (or unknown), a probe is a shadow step instead:
the head drafts one token, the target decodes one token as usual, and only the two are compared,
which is acceptance evidence for one head decode. So a useless head costs a shadow step now and
then; a machine where drafting cannot pay at any acceptance stops probing; a head that becomes
useful is found again.

While off, `sleep` is set unless the head looks useful (hit rate >= SHADOW_RATE) and plain steps
are long enough (>= SLEEP_BELOW): the runtime then stops calling a drafter that can resume cold
(the MTP drafter restarts its context at the current position, without the history before it:
an off controller costs plain decoding plus a counter); otherwise the off drafter stays in step
(~1% of a small model's decoding: its catch-up rows decoded in batches) and keeps its history,
which heads that attend over it need to be judged fairly.

`resolve(rt, cfg, controller)` turns "auto" / "adaptive" into a concrete config (+ controller).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from mtp_cli.runtime import GenConfig, Runtime

_now = time.perf_counter

ADAPTIVE_N_MAX = 8  # upper bound of N for "adaptive" (and "auto" without a profile)
GAMMA_ACC = 0.99  # per step: acceptance evidence halves in ~69 steps
GAMMA_COST = 0.998  # per step: cost evidence halves in ~350 steps
WINDOW_ON = 8  # steps between decisions while drafting
WINDOW_OFF = 128  # steps between decisions while off and no probe is worth it
WINDOW_START = 4
GAP_MIN, GAP_MAX = 8, 512  # steps between probes
SLOPE_OPTIMISM = 0.5  # unmeasured N: cost extrapolated at this fraction of the measured slope
MIN_WEIGHT = 0.5  # cost evidence (decayed steps) below which a setting counts as unmeasured
SHADOW_RATE = 0.25  # while off and the head's first-token hit rate is below this (or unknown), probes are shadow steps
PROBE_MARGIN = 1.02
CLOSE_CALL = 0.9  # a probe within this of the best is repeated without the budget wait
PROBE_STEPS = 4  # a (non-shadow) probe: one warm-up step (graph rebuilds, catch-up), then three timed
PRIOR_WEIGHT = 0.5  # pseudo-observations behind the acceptance point estimates
SLEEP_BELOW = 0.002  # seconds per plain step: below this, an off drafter sleeps (skips steps, restarts cold)
PROBE_BUDGET = 0.005  # a probe that changes nothing waits until its extra cost is this share of the steps since


class AdaptiveController:
    """Per-step choice of N in 0..n_max (see the module docstring).

    costs: relative step costs by N (costs[0] = plain decoding). With measure=False they replace
    measurement entirely (deterministic decisions, for tests and what-if studies); with
    measure=True they only shape the cost of settings not yet measured (e.g. a tuned cost model).
    may_sleep: None = when plain steps are shorter than SLEEP_BELOW; True / False to force.
    """

    def __init__(self, n_max: int = ADAPTIVE_N_MAX, *, costs: Optional[Sequence[float]] = None,
                 measure: bool = True, start: int = 0, may_sleep: Optional[bool] = None):
        if n_max < 1:
            raise ValueError("n_max must be >= 1")
        if costs is not None and len(costs) < n_max + 1:
            raise ValueError(f"costs needs {n_max + 1} entries (N = 0..{n_max})")
        if not measure and costs is None:
            raise ValueError("measure=False needs costs")
        self.n_max = n_max
        L = n_max + 1
        self._costs = [float(c) for c in costs[:L]] if costs is not None else None
        self._may_sleep_forced = may_sleep
        self._measure = measure
        self._S = [0.0] * L  # decayed sum of step seconds by N
        self._C = [0.0] * L  # decayed step counts by N
        self._D = [0.0] * n_max  # decayed counts: draft position i was drafted
        self._A = [0.0] * n_max  # ... and accepted
        self._nk = [0] * (L + 1)  # this window: steps by drafted count k >= 1
        self._na = [0] * (L + 1)  # ... by accepted count a >= 1
        start = max(0, min(int(start), n_max))
        self.n = start  # N for the current window
        self.best = start
        # drafting is off: a drafter that can resume cold may skip steps
        self.sleep = start == 0 and may_sleep is not False
        self.shadow = False  # this step: draft one token but do not verify it; report shadow_result()
        self.quiet = 0  # after a step() call: the caller may skip this many calls (drafting off: nothing to report)
        self._probing = 0  # 1: a probe's first step runs, 2: its timed steps run
        self._gap = 2 * GAP_MIN if start == 0 else GAP_MIN  # starting off: the first (shadow) probe after 16 steps
        self._wait = 0.0  # steps the last probe's extra cost asks the next one to wait (PROBE_BUDGET)
        self._since = 0  # steps since the last probe
        # step counts are totals over generations: base (completed before this generation) + done
        self._base = 0
        self._w0 = 0  # the total at which the current window's uncounted steps start
        self._due = self._gap if start == 0 else WINDOW_START  # the total at which the next decision is due
        self._t0 = _now()  # the window's clock (restarted by begin: a partial window's time is dropped)
        self._tc0 = 0.0
        self._active = False  # between begin() and end()
        # what happened (for reports and tests)
        self.steps_at = [0] * L  # steps run at each N (requested: the loop may draft fewer near the end)
        self.n_probes = 0
        self.n_shadow = 0
        self.n_switches = 0
        self.changes: list[tuple[int, int]] = []  # (step, new best N)
        self.steps = 0

    # -- the per-step interface -----------------------------------------------------------------

    def begin(self, t_consumer: float = 0.0) -> None:
        """A generation starts (its steps follow): restart the window's clock."""
        if any(self._nk):
            self._fold_acceptance()  # keep what the last generation's partial window saw (not its time)
        self._nk = [0] * (self.n_max + 2)
        self._na = [0] * (self.n_max + 2)
        self._t0 = _now()
        self._tc0 = t_consumer
        if not self.sleep:
            self._due = min(self._due, self._base + WINDOW_ON)
        # the first call (done = 0) answers from the fast path: let the caller skip to the decision
        self.quiet = max(0, self._due - self._base - 1) if self.sleep else 0
        self._active = True

    def end(self, done: int) -> None:
        """The generation ended after `done` steps: count the unfinished window's steps (its time is
        dropped: begin() restarts the clock)."""
        if not self._active:  # it ended before its first step
            return
        self._active = False
        total = self._base + done
        steps = max(0, total - self._w0)
        self.steps_at[self.n if not self.shadow else 0] += steps
        self._since += steps
        self.steps += steps
        self._w0 = self._base = total

    def shadow_result(self, hit: bool) -> None:
        """A shadow step's draft token was (hit) or was not the token the target produced."""
        self._nk[1] += 1
        if hit:
            self._na[1] += 1

    def step(self, k: int, a: int, t_consumer: float, done: int) -> int:
        """Report the previous step (k drafted, a accepted; anything <= 0 before the first; `done`
        steps of this generation completed) and get N for the next. Afterwards `quiet` calls may be
        skipped (the caller keeps N and reports nothing: drafting is off)."""
        if k > 0:
            self._nk[k] += 1
            self._na[a] += 1
        if self._base + done < self._due:
            return self.n
        return self._decide(t_consumer, self._base + done)

    # -- estimates --------------------------------------------------------------------------------

    def cost(self, n: int) -> Optional[float]:
        """Measured seconds (or relative units, with measure=False) per step at N, or None."""
        if not self._measure:
            return self._costs[n]  # type: ignore[index]
        return self._S[n] / self._C[n] if self._C[n] >= MIN_WEIGHT else None

    def acceptance(self) -> list[float]:
        """Point estimates of P(first i+1 drafts accepted), i = 0..n_max-1: the decayed counts plus
        PRIOR_WEIGHT pseudo-observations of the geometric continuation from i-1 (0 at i = 0)."""
        out = []
        prev2, prev = 1.0, 1.0
        for i in range(self.n_max):
            if i == 0:
                extra = 0.0
            else:
                extra = min(prev, prev * prev / prev2) if prev2 > 0 else 0.0
            p = (self._A[i] + PRIOR_WEIGHT * extra) / (self._D[i] + PRIOR_WEIGHT)
            p = min(p, prev)
            out.append(p)
            prev2, prev = prev, p
        return out

    def acceptance_upper(self) -> list[float]:
        """Optimistic P(first i+1 drafts accepted): (A+1)/(D+1) where position i has evidence,
        else the geometric continuation u[i-1] * u[0]."""
        out: list[float] = []
        prev = 1.0
        for i in range(self.n_max):
            u = (self._A[i] + 1.0) / (self._D[i] + 1.0)
            if i and self._D[i] < MIN_WEIGHT:
                u = prev * out[0]
            u = min(prev, u)
            out.append(u)
            prev = u
        return out

    def _cost_optimistic(self, n: int, measured: list[Optional[float]]) -> float:
        c = measured[n]
        if c is not None:
            return c
        below = [j for j in range(n) if measured[j] is not None]
        if not below:
            return 0.0  # never measured and nothing cheaper known: worth a look
        j1 = below[-1]
        c1 = measured[j1]
        if self._costs is not None:  # a cost model's shape
            return c1 * self._costs[n] / max(self._costs[j1], 1e-12)  # type: ignore[operator]
        if len(below) >= 2:
            j0 = below[-2]
            slope = (c1 - measured[j0]) / (j1 - j0)  # type: ignore[operator]
            return c1 + SLOPE_OPTIMISM * max(slope, 0.0) * (n - j1)  # type: ignore[operator]
        return c1 * (1.0 + 0.1 * (n - j1))  # type: ignore[operator]

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

    # -- decisions --------------------------------------------------------------------------------

    def _fold_acceptance(self) -> None:
        nk, na, D, A = self._nk, self._na, self._D, self._A
        c = 0
        for k in range(self.n_max, 0, -1):
            c += nk[k]
            D[k - 1] += c
        c = 0
        for j in range(self.n_max, 0, -1):
            c += na[j]
            A[j - 1] += c

    def _decide(self, t_consumer: float, total: int) -> int:
        now = _now()
        L = self.n_max + 1
        steps = total - self._w0  # since the window started, or this generation did (the clock's start)
        n_win = self.n
        if steps:
            ga = GAMMA_ACC ** steps
            D, A = self._D, self._A
            for i in range(self.n_max):
                D[i] *= ga
                A[i] *= ga
            self._fold_acceptance()
            per = (now - self._t0 - (t_consumer - self._tc0)) / steps
            warm_up = self._probing == 1 and not self.shadow  # its time is the switch's, not the setting's
            if self._probing and not warm_up:
                self._wait = self._probe_wait(n_win, per)
            if self._measure and not self.shadow and not warm_up:  # a shadow step is plain decoding plus a head decode
                S, C = self._S, self._C
                if C[n_win] >= MIN_WEIGHT:
                    per = min(per, 3.0 * S[n_win] / C[n_win])  # a preempted step is not the setting's cost
                gc = GAMMA_COST ** steps
                for n in range(L):
                    S[n] *= gc
                    C[n] *= gc
                S[n_win] += per * steps
                C[n_win] += steps
            self.steps += steps
            self._since += steps
            self.steps_at[0 if self.shadow else n_win] += steps  # a shadow step verifies one token
        self._nk = [0] * (L + 1)
        self._na = [0] * (L + 1)
        self._w0 = total
        if self._probing == 1 and not self.shadow:  # the probe's timed steps follow
            self._probing = 2
            self._due = total + PROBE_STEPS - 1
            self.quiet = 0
            self._t0 = _now()
            self._tc0 = t_consumer
            return self.n
        due = max(self._gap, self._wait)
        if n_win == 0 and self.best == 0 and not self._probing and self._since < due:
            return self._next_window(max(int(due - self._since), 1), t_consumer, total)  # off, no probe due yet

        thr = self.throughput()
        old = self.best
        cands = [n for n in range(L) if thr[n] is not None]
        best = max(cands, key=lambda n: thr[n]) if cands else old  # type: ignore[arg-type,return-value]
        if best != old:
            self.best = best
            self.n_switches += 1
            self.changes.append((self.steps, best))
            self._gap = GAP_MIN
            self._wait = 0.0
        if self._probing:
            self._probing = 0
            if best == old:  # nothing changed: probe less often
                self._gap = min(2 * self._gap, GAP_MAX)
                t_probe, t_best = thr[n_win], thr[best]
                if not self.shadow and t_probe and t_best and t_probe >= CLOSE_CALL * t_best:
                    self._wait = 0.0  # a close call (a few steps say little): look again soon

        probe = None
        if self._since >= max(self._gap, self._wait):
            probe = self._probe_candidate(thr)
        self.shadow = False
        if probe is not None:
            self._probing = 1
            self._since = 0
            self.n = probe
            window = 1
            d0 = self._D[0]
            if probe and self.best == 0 and (d0 <= 0.0 or self._A[0] / d0 < SHADOW_RATE):
                self.shadow = True  # is the head any good? costs plain decoding plus one head decode
                self.n = 1
                self.n_shadow += 1
            else:
                self.n_probes += 1
        else:
            self.n = self.best
            if self.best:
                window = WINDOW_ON
            else:
                due = max(self._gap, self._wait)
                window = max(int(due - self._since), 1) if self._since < due else WINDOW_OFF
        self.sleep = self.best == 0 and self.n == 0 and self._may_sleep()
        return self._next_window(window, t_consumer, total)

    def _next_window(self, window: int, t_consumer: float, total: int) -> int:
        self._due = total + window
        self.quiet = window - 1 if self.sleep else 0  # the caller skips the calls until the next decision
        self._t0 = _now()
        self._tc0 = t_consumer
        return self.n

    def _may_sleep(self) -> bool:
        """Keeping an off drafter in step (its catch-up rows queued and decoded in batches: ~1% of a
        small model's plain decoding) keeps the head's history, so probes see its real acceptance
        (after a cold restart a head that attends over its history reads low). Worth it for a head
        that looks useful, unless plain steps are so short that it shows (tiny models); a head that
        hits less than SHADOW_RATE (or not yet probed) sleeps."""
        if self._may_sleep_forced is not None:
            return self._may_sleep_forced
        if not self._measure:
            return True
        c0 = self.cost(0)
        if c0 is None or c0 < SLEEP_BELOW:
            return True
        d0 = self._D[0]
        return d0 <= 0.0 or self._A[0] / d0 < SHADOW_RATE

    def _probe_wait(self, n: int, per: float) -> float:
        """Steps before the next probe so that probes cost at most PROBE_BUDGET of the time: this
        probe's extra cost over a step at the best N, in steps, divided by the budget."""
        base = self.cost(self.best)
        if not base:
            return 0.0
        if self._measure:
            c = min(per, 3.0 * base)
        elif self.shadow:
            return 0.0  # (fixed costs say nothing about a shadow step)
        else:
            c = self._costs[n]  # type: ignore[index]
        return max(0.0, c / base - 1.0) / PROBE_BUDGET

    def _probe_candidate(self, thr: list[Optional[float]]) -> Optional[int]:
        """The N with the highest optimistic throughput, if that beats the best's estimate (an
        unmeasured N = 0 first: its cost is the baseline)."""
        base = thr[self.best] or 0.0
        measured = [self.cost(n) for n in range(self.n_max + 1)]
        up = self.acceptance_upper()
        pick, top = None, base * PROBE_MARGIN
        e = 1.0
        for n in range(self.n_max + 1):
            if n:
                e += up[n - 1]
            if n == self.best:
                continue
            c = self._cost_optimistic(n, measured)
            if c <= 0.0:
                return n
            if e / c > top:
                pick, top = n, e / c
        return pick

    def summary(self) -> dict[str, Any]:
        return {"n": self.best, "steps_at": list(self.steps_at), "probes": self.n_probes,
                "shadow_probes": self.n_shadow,
                "switches": self.n_switches, "acceptance": [round(x, 4) for x in self.acceptance()],
                "cost": [self.cost(n) for n in range(self.n_max + 1)]}

    def describe(self) -> str:
        used = ", ".join(f"N={n}: {s}" for n, s in enumerate(self.steps_at) if s)
        seen = f"; head's first draft ~{self._A[0] / self._D[0]:.0%} right" if self._D[0] >= 5 else ""
        why = " (drafting would not beat plain decoding here)" if self.best == 0 and self.steps else ""
        return (f"adaptive: now N={self.best}{why}; steps {used or '-'}; {self.n_probes} probes "
                f"(+{self.n_shadow} shadow), {self.n_switches} switches{seen}")


# ---------------------------------------------------------------------------------------------
# "auto" and "adaptive"
# ---------------------------------------------------------------------------------------------

NO_PROFILE_NOTE = ("no tuned profile for this model on this machine (run `mtp-cli tune -m MODEL`); "
                   "choosing N adaptively while generating")


@dataclass
class Resolved:
    config: "GenConfig"  # draft_n_max is an int; spec_type may have become "none" (a profile said off)
    controller: Optional[AdaptiveController]
    mode: str  # "fixed", "profile" or "adaptive"
    note: Optional[str] = None
    profile: Any = None


def resolve(rt: "Runtime", cfg: "GenConfig", controller: Optional[AdaptiveController] = None) -> Resolved:
    """"auto": the saved profile for this model + machine (mtp only), else adaptive with a note.
    "adaptive": a controller (the one given, else one kept on the runtime per spec type)."""
    from mtp_cli import profiles

    mode = cfg.draft_n_max
    if not isinstance(mode, str) or cfg.spec_type == "none":
        n = cfg.draft_n_max if isinstance(cfg.draft_n_max, int) else 1
        return Resolved(replace(cfg, draft_n_max=n), None, "fixed")
    note = None
    prof = None
    if mode == "auto":
        if cfg.spec_type == "mtp":
            prof = profiles.find(rt.profile_key(cfg))
        if prof is not None:
            said = (f"tuned profile: {prof.setting} ({prof.ratio_vs_none:.2f}x plain decoding when tuned"
                    f"{', ' + prof.created[:10] if prof.created else ''})")
            if prof.spec_type == "none":
                return Resolved(replace(cfg, spec_type="none", draft_n_max=1), None, "profile", said, prof)
            return Resolved(replace(cfg, draft_n_max=int(prof.draft_n_max), draft_p_min=float(prof.draft_p_min)),
                            None, "profile", said, prof)
        note = NO_PROFILE_NOTE if cfg.spec_type == "mtp" else None
    ctl = controller
    if ctl is None:
        ctl = rt._controllers.get(cfg.spec_type)
        if ctl is None:
            ctl = rt._controllers[cfg.spec_type] = AdaptiveController(ADAPTIVE_N_MAX)
    return Resolved(replace(cfg, draft_n_max=ctl.n_max), ctl, "adaptive", note, None)


__all__ = ["AdaptiveController", "Resolved", "resolve", "ADAPTIVE_N_MAX", "NO_PROFILE_NOTE"]
