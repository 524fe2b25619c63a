"""AdaptiveController: the draft length N chosen while generating (a DraftPolicy).

The verify loop calls `step(k, a, t_consumer, done)` at the start of each step (k = tokens the
previous step drafted, a = accepted) and drafts at most the N it returns. Per step that is a few
list increments and a counter; while drafting is off and no decision is due, a counter only.
Every few steps (`_decide`) the controller folds what it saw into the running estimates of
mtp_cli.speed.evidence.

The rule: N = the measured setting with the highest throughput; N = 0 (plain decoding) when no
drafting setting beats it. Exploration is by probes, at most one per `gap` steps (GAP_MIN, doubling
to GAP_MAX while probes change nothing) and, after a probe that changed nothing, not before its
extra cost is PROBE_BUDGET (0.5%) of the steps since (unless it came within CLOSE_CALL of the best).
A probe runs the N with the highest optimistic throughput if that beats the best; PROBE_STEPS
steps, the first untimed (graph rebuilds, catch-up), none of its timed ones among the first steps
of a generation, which the loop leaves untimed (mtp_cli.policy.StepClock): a probe due there waits.
While drafting is off and the head's first-token hit rate is below SHADOW_RATE (or unknown), a
probe is up to SHADOW_STEPS shadow steps instead (ending once the rest cannot change its verdict;
untimed steps may hold them): the head drafts one token, the target decodes one as usual, and the
two are compared, acceptance evidence for one head decode. So a useless head costs a shadow step
now and then; a machine where drafting cannot pay at any acceptance stops probing; a head that
becomes useful is found again. A real probe while the drafter sleeps comes after WARM_STEPS plain
steps (or the rest of a generation's opening) with the drafter in step (it re-reads the prompt's
rows on waking, drafters.recall).

While off, `sleep` is set: the loop stops calling a drafter that can resume cold (the MTP drafter
restarts at the current position, with only the prompt's last rows below it), so an off controller
costs plain decoding plus a counter. Kept in step, an off drafter cost ~1% of a small model's
decoding and, over RPC, the target's h rows: one more round trip per token (7% at 1 ms, 30% at 5
ms); judged by measuring both, one noisy window kept it in step for good (over RPC at 0 ms, 0.94x
plain against 0.99x asleep).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Optional

from mtp_cli.errors import ConfigError
from mtp_cli.policy import UNTIMED_AFTER_PROMPT, DraftPolicy
from mtp_cli.speed.evidence import GAMMA_ACC, Evidence

_now = time.perf_counter

ADAPTIVE_N_MAX = 8  # upper bound of N for "adaptive" (and "auto" without a profile)
WINDOW_ON = 8  # steps between decisions while drafting
WINDOW_OFF = 128  # steps between decisions while off and no probe is worth it
WINDOW_START = 4
GAP_MIN, GAP_MAX = 8, 512  # steps between probes
GAP_START = 4  # starting off, the first look after this many plain steps (over RPC a 32-token answer: ~12 steps)
SHADOW_RATE = 0.25  # while off and the head's first-token hit rate is below this (or unknown), probes are shadow steps
# a drafting N replaces another as the best only when this much better (over RPC, 2 servers: N = 2 and
# 3 within 4% of each other, and the best switched 7-8 times in 140 steps); to or from plain decoding
# the estimates decide alone (a win is taken, a loss left, at once)
SWITCH_MARGIN = 1.03
CLOSE_CALL = 0.9  # a probe within this of the best is repeated without the budget wait
PROBE_STEPS = 4  # a (non-shadow) probe: one warm-up step (graph rebuilds, catch-up), then three timed
SHADOW_STEPS = 4  # a shadow probe's steps (over RPC one early miss kept an 86% head off for 60 steps)
HIT_DOUBT = 1.0  # one miss more than seen, where a hit rate decides: one hit in a shadow probe's 4 is no useful head
# an asleep head follows this many plain steps before a probe (cold, the demo's first draft hit 17%, 54% after
# 8; re-reading the prompt's rows, 62% at once, and 8 more gave nothing: 16 eval prompts)
WARM_STEPS = 2
PROBE_BUDGET = 0.005  # a probe that changes nothing waits until its extra cost is this share of the steps since


class AdaptiveController(DraftPolicy):
    """Per-step choice of N in 0..n_max (see the module docstring).

    costs: relative step costs by N (costs[0] = plain decoding). With measure=False they replace
    measurement entirely (deterministic decisions, for tests and what-if studies); with
    measure=True they only shape the cost of settings not yet measured (e.g. a tuned cost model).
    may_sleep: False keeps an off drafter in step (for tests of the drafters' catch-up).
    """

    def __init__(
        self,
        n_max: int = ADAPTIVE_N_MAX,
        *,
        costs: Optional[Sequence[float]] = None,
        measure: bool = True,
        start: int = 0,
        may_sleep: bool = True,
    ):
        if n_max < 1:
            raise ConfigError("`n_max` must be >= 1")
        if costs is not None and len(costs) < n_max + 1:
            raise ConfigError(f"costs needs {n_max + 1} entries (N = 0..{n_max})")
        if not measure and costs is None:
            raise ConfigError("measure=False needs costs")
        super().__init__(n_max)
        self.ev = Evidence(n_max, costs, measure)
        self.may_sleep = may_sleep
        self._nk = [0] * (n_max + 2)  # this window: steps by drafted count k >= 1
        self._na = [0] * (n_max + 2)  # ... by accepted count a >= 1
        start = max(0, min(int(start), n_max))
        self.n = self.best = start  # N for the current window; the best setting so far
        self.sleep = start == 0 and may_sleep
        self.shadow = False
        self.quiet = 0  # steps step() answers without looking (drafting off, nothing to count)
        self._probing = 0  # 1: a probe's first step runs, 2: its timed steps run
        self._retimed = False  # the probe's timed steps were run again (a generation's end dropped their time)
        self._deferred = False  # the pending probe (_warm) has had its one wait for a generation's opening
        self._warm: Optional[int] = None  # the probe a warm-up (an asleep head's, a generation's opening) leads to
        self._climbed = start  # the largest N probed (or started at) so far: probes go at most one past it
        self._gap = GAP_START  # starting off: the first (shadow) probe after GAP_START plain steps and its warm-up
        self._wait = 0.0  # steps the last probe's extra cost asks the next one to wait (PROBE_BUDGET)
        self._since = 0  # steps since the last probe
        # step counts are totals over generations: base (completed before this generation) + done
        self._base = 0
        self._w0 = 0  # the total at which the current window's uncounted steps start
        self._due = self._gap if start == 0 else WINDOW_START  # the total at which the next decision is due
        self._t0 = _now()  # the window's clock (restarted by begin: a partial window's time is dropped)
        self._tc0 = 0.0
        self._f_steps, self._f_time = 0, 0.0  # this window's foreign steps (another drafter's) and their time
        self._active = False  # between begin() and end()
        # what happened (for reports and tests)
        self.steps_at = [0] * (n_max + 1)  # steps run at each N (requested: the loop may draft fewer near the end)
        self.n_probes = self.n_shadow = self.n_switches = self.steps = 0
        self.changes: list[tuple[int, int]] = []  # (step, new best N)

    # -- the DraftPolicy interface ---------------------------------------------------------------

    def begin(self, t_consumer: float = 0.0) -> None:
        """A generation starts (its steps follow): restart the window's clock."""
        if any(self._nk):
            self.ev.fold(self._nk, self._na)  # keep what the last generation's partial window saw (not its time)
        self._nk = [0] * (self.n_max + 2)
        self._na = [0] * (self.n_max + 2)
        self._t0 = _now()
        self._tc0 = t_consumer
        self._f_steps, self._f_time = 0, 0.0
        self.sleep = self.sleep and self.can_sleep  # (a drafter that cannot sleep is in step: no warm-up either)
        if not self.sleep:
            self._due = min(self._due, self._base + WINDOW_ON)
        if self._probing == 2:  # (its timed steps' time went with the last generation: timed again, past the opening)
            self._due = self._base
        # the first call (done = 0) answers from the fast path: skip to the decision
        self.quiet = max(0, self._due - self._base - 1) if self.sleep else 0
        self._active = True

    def end(self, done: int) -> None:
        """The generation ended after `done` steps: count the unfinished window's steps (its time is
        dropped: begin() restarts the clock)."""
        if not self._active:  # it ended before its first step
            return
        self._active = False
        total = self._base + done
        steps = max(0, total - self._w0 - self._f_steps)  # (its own, as _observe counts them)
        self._f_steps, self._f_time = 0, 0.0
        self.steps_at[self.n if not self.shadow else 0] += steps
        self._since += steps
        self.steps += steps
        self._w0 = self._base = total

    def shadow_result(self, hit: bool) -> None:
        """A shadow step's draft token was (hit) or was not the token the target produced."""
        self._nk[1] += 1
        if hit:
            self._na[1] += 1

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        """Report the previous step (anything <= 0 before the first; `done` steps of this generation
        completed) and get N for the next."""
        if self.quiet:  # drafting is off until the next decision: nothing to count
            self.quiet -= 1
            return self.n
        if drafted > 0:
            self._nk[drafted] += 1
            self._na[accepted] += 1
        if self._base + done < self._due and not (self.shadow and self._shadow_settled()):
            return self.n
        return self._decide(t_consumer, self._base + done)

    def _shadow_settled(self) -> bool:
        """The shadow probe's verdict (its hit rate against SHADOW_RATE) is the same whatever its steps
        left show: it ends now (two hits in two already earn a real probe)."""
        seen = self._nk[1]
        left = SHADOW_STEPS - seen
        if left <= 0 or not seen:
            return False
        g = GAMMA_ACC**seen  # (the decay the decision applies)
        a, d = g * self.ev.A[0] + self._na[1], g * self.ev.D[0] + SHADOW_STEPS + HIT_DOUBT
        return a / d >= SHADOW_RATE or (a + left) / d < SHADOW_RATE

    # -- estimates (the evidence's) ------------------------------------------------------------

    def cost(self, n: int) -> Optional[float]:
        return self.ev.cost(n)

    def acceptance(self) -> list[float]:
        return self.ev.acceptance()

    def throughput(self) -> list[Optional[float]]:
        return self.ev.throughput()

    # -- decisions -------------------------------------------------------------------------------

    def foreign(self, seconds: float) -> None:
        """A step another drafter drafted (a self-sized lookup beside the head): its time and its one
        step are left out of what this window measures."""
        self._f_steps += 1
        self._f_time += seconds

    def _decide(self, t_consumer: float, total: int) -> int:
        n_win = self.n
        steps = total - self._w0 - self._f_steps  # since the window started, or this generation did: its own
        if steps > 0:
            self._observe(steps, n_win, (_now() - self._t0 - (t_consumer - self._tc0) - self._f_time) / steps)
        elif any(self._nk):  # (untimed steps only: what they drafted is still acceptance evidence)
            self.ev.fold(self._nk, self._na)
        self._nk = [0] * (self.n_max + 2)
        self._na = [0] * (self.n_max + 2)
        self._w0 = total
        # the probe's timed steps follow, or follow again once where a generation's end dropped their time
        # (replayed with 32-token answers, ~11 steps each at N = 3: 5-8% of probes measured nothing, and over RPC
        # one at N = 3 that did kept the N that paid off for the rest of a row)
        again = self._probing == 2 and steps <= 0 and not self.shadow and not self._retimed
        if (self._probing == 1 and not self.shadow) or again:
            return self._timed_steps(again, t_consumer, total)
        if self._warm is not None:  # a pending probe: started, or waiting out a generation's opening (once)
            return self._next_window(self._pending_probe(total), t_consumer, total)
        due = max(self._gap, self._wait)
        if n_win == 0 and self.best == 0 and not self._probing and self._since < due:  # off, no probe due yet
            return self._next_window(self._off_window(int(due - self._since)), t_consumer, total)
        thr = self.ev.throughput()
        self._update_best(thr, n_win)
        window = self._next_setting(thr, self._opening(total))
        return self._next_window(self._off_window(window), t_consumer, total)

    def _timed_steps(self, again: bool, t_consumer: float, total: int) -> int:
        """A probe's timed steps (again: re-timed, a generation's end dropped their time), past any opening."""
        self._probing, self._retimed = 2, again
        self._due = total + PROBE_STEPS - 1 + self._untimed_left(total)
        self.quiet = 0
        self._t0, self._tc0 = _now(), t_consumer
        self._f_steps, self._f_time = 0, 0.0
        return self.n

    def _pending_probe(self, total: int) -> int:
        """The probe a warm-up led to, or (once: a generation may end in it) the rest of an opening first."""
        left = self._opening(total)
        if left and not self._deferred:
            self._deferred = True
            return left
        probe, self._warm = self._warm, None
        return self._start_probe(probe)  # type: ignore[arg-type]  # (_warm was set)

    def _off_window(self, window: int) -> int:
        """Whether an off drafter sleeps (but in a probe's warm-up); the window's length."""
        self.sleep = self.best == 0 and self.n == 0 and self._warm is None and self.can_sleep and self.may_sleep
        return max(window, 1)

    def _observe(self, steps: int, n_win: int, per: float) -> None:
        """Fold the window's acceptance and, unless it was a shadow or warm-up step, its cost."""
        self.ev.decay_acceptance(steps)
        self.ev.fold(self._nk, self._na)
        warm_up = self._probing == 1 and not self.shadow  # its time is the switch's, not the setting's
        if self._probing and not warm_up:
            self._wait = self._probe_wait(n_win, per, steps)
        if self.ev.measure and not self.shadow and not warm_up:  # a shadow step is plain decoding plus a head decode
            if self._warm is None:  # (a probe's warm-up is the probe's cost; an opening's steps are untimed)
                self.ev.add_cost(n_win, per, steps)
        self.steps += steps
        self._since += steps
        self.steps_at[0 if self.shadow else n_win] += steps  # a shadow step verifies one token

    def _update_best(self, thr: list[Optional[float]], n_win: int) -> None:
        old = self.best
        judged = self.ev.judged(thr, old)
        cands = [n for n in range(self.n_max + 1) if judged[n] is not None]
        best = max(cands, key=lambda n: judged[n]) if cands else old  # type: ignore[arg-type,return-value]
        t_old, t_new, t_plain = thr[old], judged[best], thr[0]
        if t_old is None or t_new is None or not (best and old):
            close = False
        else:  # (never held below plain decoding)
            close = t_new < SWITCH_MARGIN * t_old and (t_plain is None or t_old >= t_plain)
        if close:
            best = old  # (a few steps' noise between two close N: switching costs graph rebuilds)
        if best != old:
            self.best = best
            self.n_switches += 1
            self.changes.append((self.steps, best))
            self._gap = GAP_MIN
            self._wait = 0.0
        if self._probing:
            self._probing = 0
            if self.shadow and (self.ev.hit_rate(HIT_DOUBT) or 0.0) >= SHADOW_RATE:
                # the head looks useful: a real probe next, while it is in step
                self._since, self._wait = self._gap, 0.0
            elif best == old:  # nothing changed: probe less often
                self._gap = min(2 * self._gap, GAP_MAX)
                t_probe, t_best = thr[n_win], thr[best]
                # (thr, not judged: a larger N held back by DEEP_DOUBT alone is looked at again for its evidence)
                if not self.shadow and t_probe and t_best and t_probe >= CLOSE_CALL * t_best:
                    self._wait = 0.0  # a close call (a few steps say little): look again soon

    def _next_setting(self, thr: list[Optional[float]], opening: int) -> int:
        """Set N for the next window (a probe, its warm-up, a shadow step, or the best); its length in
        steps. opening: steps before a probe's timed steps would be timed (_opening)."""
        looking = self._since >= max(self._gap, self._wait)
        probe = self.ev.promising(thr, self.best, self._climbed) if looking else None
        self.shadow = False
        if probe is not None:
            # an asleep head first catches up a few steps (a cold one reads low), but for a shadow probe: it asks
            # 25%, and it keeps the head in step for the real probe that may follow
            real = not self._shadow_due(probe)  # (a shadow step is not timed: it may run in an opening)
            if self.sleep and real:
                self._warm, self.n, self._deferred = probe, 0, opening > 0
                return max(WARM_STEPS, opening)
            if opening and real:
                self._warm, self.n, self._deferred = probe, self.best, True
                return opening
            return self._start_probe(probe)
        self.n = self.best
        if self.best:
            return WINDOW_ON
        due = max(self._gap, self._wait)
        return max(int(due - self._since), 1) if self._since < due else WINDOW_OFF

    def _untimed_left(self, total: int) -> int:
        """Steps the loop leaves untimed at this generation's start (UNTIMED_AFTER_PROMPT) still to come."""
        return max(0, UNTIMED_AFTER_PROMPT - (total - self._base))

    def _opening(self, total: int) -> int:
        """Steps before a probe started now would have its timed steps timed (its own first step is not):
        over RPC a probe of N = 4 started at a generation's first step ran 7 steps, its timed ones again."""
        return max(0, self._untimed_left(total) - 1)

    def _start_probe(self, probe: int) -> int:
        """A probe at N = probe, or a shadow step (is the head any good? costs plain decoding plus one
        head decode); its first window's length."""
        self._probing, self._retimed, self._deferred = 1, False, False
        self._since = 0
        self.n = probe
        if self._shadow_due(probe):
            self.shadow = True
            self.n = 1
            self.n_shadow += 1
            self._climbed = max(self._climbed, 1)
            return SHADOW_STEPS
        self.n_probes += 1
        self._climbed = max(self._climbed, self.n)
        return 1

    def _shadow_due(self, probe: int) -> bool:
        """A probe of N = probe would be shadow steps: drafting is off and the head's hit rate is low or unknown."""
        hit = self.ev.hit_rate(HIT_DOUBT)
        return bool(probe) and self.best == 0 and (hit is None or hit < SHADOW_RATE)

    def _next_window(self, window: int, t_consumer: float, total: int) -> int:
        self._due = total + window
        self.quiet = window - 1 if self.sleep else 0  # step() answers without looking until the next decision
        self._t0, self._tc0 = _now(), t_consumer
        self._f_steps, self._f_time = 0, 0.0
        return self.n

    def _probe_wait(self, n: int, per: float, steps: int = PROBE_STEPS - 1) -> float:
        """Steps before the next probe, so probes cost at most PROBE_BUDGET of the time: the time the
        probe's `steps` timed steps lost against the best N for the tokens they gave. Off, their cost
        is doubted as a probe's promise is (over RPC one dear read of N = 2 kept a 1.15x head off for a
        row); beside a drafting best, a loss is a loss (doubted, a 14% dear N = 4 was probed every ~50 steps)."""
        base = self.ev.cost(self.best)
        if not base:
            return 0.0
        if self.ev.measure:
            c = min(per, 3.0 * base) * (self.ev.doubt(n, steps) if self.best == 0 else 1.0)
        elif self.shadow:
            return 0.0  # (fixed costs say nothing about a shadow step)
        else:
            c = self.ev.costs[n]  # type: ignore[index]  # measure=False comes with costs
        acc = self.ev.acceptance()
        gives = 1.0 if self.shadow else 1.0 + sum(acc[:n])
        steps = SHADOW_STEPS if self.shadow else PROBE_STEPS  # (what the whole probe lost, not one step)
        return steps * max(0.0, c / base - gives / (1.0 + sum(acc[: self.best]))) / PROBE_BUDGET

    # -- reports -----------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        return {
            "n": self.best,
            "steps_at": list(self.steps_at),
            "probes": self.n_probes,
            "shadow_probes": self.n_shadow,
            "switches": self.n_switches,
            "acceptance": [round(x, 4) for x in self.ev.acceptance()],
            "cost": [self.ev.cost(n) for n in range(self.n_max + 1)],
        }

    def describe(self) -> str:
        used = ", ".join(f"N={n}: {s}" for n, s in enumerate(self.steps_at) if s)
        hit = self.ev.hit_rate()
        seen = f"; head's first draft ~{hit:.0%} right" if hit is not None and self.ev.D[0] >= 5 else ""
        why = " (drafting would not beat plain decoding here)" if self.best == 0 and self.steps else ""
        return (
            f"adaptive: now N={self.best}{why}; steps {used or '-'}; {self.n_probes} probes "
            f"(+{self.n_shadow} shadow), {self.n_switches} switches{seen}"
        )


__all__ = ["AdaptiveController", "ADAPTIVE_N_MAX"]
