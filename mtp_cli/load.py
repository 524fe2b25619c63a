"""Drafting by load: a sequence's draft length while other sequences share its decodes (mtp_cli.slots).

What a row of a batch costs is this machine's: on a 2-core CPU every row is compute (on the AMD EPYC
a decode of the demo's 4 rows costs about 2.7 one-row decodes), on a GPU a few rows more cost next
to nothing. So beside others a sequence drafts k tokens only where what they promise pays for the
rows they add to the shared decode and for its head's decodes. With R rows in the step (its own last
token and the others' last step's rows):

    (R + sum(acc[:k])) / (v(R - 1) + k (m + h))  >  LOAD_MARGIN * R / v(R - 1)

v: StepCosts, a decode of n + 1 rows over a one-row decode, learned from every step's decode; m: a
row's cost, the larger of v's slope and the mean cost of the rows past the first (the fitted line's
slope alone, drawn by a few noisy points and the prior, put a row at 0.2 of a decode on the AMD EPYC
where it cost 0.8, and had 2-row steps drafting); acc: the sequence's acceptance by draft position
(DraftRecord, kept across its generations); h: its drafter's decode over a one-row target decode.
R counts every row as a token, more than a step gives, so the rule errs toward plain decoding; costs
not yet measured, a drafter never timed or too little acceptance evidence: no drafts. Alone, the
sequence's own policy decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

from mtp_cli.policy import DraftPolicy
from mtp_cli.step_costs import StepCosts

LOAD_MARGIN = 1.1  # drafting beside others must beat the shared step's rate by this much (costs are noisy)
LOAD_WINDOW = 8  # steps between decisions beside others (each switch rebuilds graphs, wakes a head)
LOAD_WARM = 8  # an asleep head follows this many steps before it drafts beside others (cold, it drafts low)
LOAD_EVIDENCE = 16.0  # decayed first-draft counts below which a sequence's acceptance is unknown
GAMMA = 0.99  # per drafted step: acceptance evidence halves in ~69 of them
HEAD_DECAY = 0.1  # weight of a new drafter decode time in its mean

Clock = Callable[[], tuple[float, int]]  # a drafter's (seconds, count) of decodes this generation


@dataclass
class DraftRecord:
    """What a sequence's drafted steps showed, kept across its generations by the runner: decayed
    counts of draft position i drafted and accepted, and its drafter's mean decode seconds."""

    drafted: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    head_s: Optional[float] = None
    _last: tuple[float, int] = (0.0, 0)

    def seen(self, k: int, a: int) -> None:
        """A step drafted k tokens and kept the first a."""
        if k <= 0:
            return
        if len(self.drafted) < k:
            self.drafted += [0.0] * (k - len(self.drafted))
            self.accepted += [0.0] * (k - len(self.accepted))
        for i in range(len(self.drafted)):
            self.drafted[i] = GAMMA * self.drafted[i] + (i < k)
            self.accepted[i] = GAMMA * self.accepted[i] + (i < a)

    def clocked(self, seconds: float, count: int) -> None:
        """The drafter's decode totals now (they restart with each generation)."""
        t0, n0 = self._last
        self._last = (seconds, count)
        if count > n0 and seconds >= t0:
            per = (seconds - t0) / (count - n0)
            self.head_s = per if self.head_s is None else self.head_s + HEAD_DECAY * (per - self.head_s)

    def acceptance(self, n: int) -> Optional[list[float]]:
        """P(draft position i is kept), i < n, non-increasing, continued geometrically past the
        positions seen; None with too little evidence."""
        if not self.drafted or self.drafted[0] < LOAD_EVIDENCE:
            return None
        out: list[float] = []
        for i in range(n):
            seen = i < len(self.drafted) and self.drafted[i] >= 1.0
            p = self.accepted[i] / self.drafted[i] if seen else (out[-1] * out[0] if out else 0.0)
            out.append(min(p, out[-1]) if out else p)
        return out


def drafts_beside(rows: int, acc: Sequence[float], v: Callable[[int], float], h: float) -> int:
    """The draft length k <= len(acc) for a sequence whose step shares a decode of `rows` rows (its
    own last token included) that gives the most tokens per unit of time, if that beats the step
    without drafts by LOAD_MARGIN; else 0 (see the module docstring)."""
    now = v(rows - 1)
    row = max(v(rows) - now, (now - 1.0) / (rows - 1) if rows > 1 else 0.0)
    best, top, gain = 0, LOAD_MARGIN * rows / now, 0.0
    for k in range(1, len(acc) + 1):
        gain += acc[k - 1]
        rate = (rows + gain) / (now + k * (row + h))
        if rate > top:
            best, top = k, rate
    return best


class LoadGate(DraftPolicy):
    """A sequence's policy in a runner that batches several (mtp_cli.slots). Alone, its own policy
    (`inner`) decides; beside others (`others()`: the rows they put in the last shared step, 0 when
    alone), every LOAD_WINDOW steps drafts_beside does, for the policy's drafter: a text lookup
    (self-sized) drafts nothing then, its costs weighed as if alone. An asleep head follows LOAD_WARM
    steps before it drafts. The steps decided here are the inner policy's foreign ones (left out of
    what it measures); their acceptance is the record's."""

    def __init__(
        self, inner: DraftPolicy, others: Callable[[], int], costs: StepCosts, record: DraftRecord, clock: Clock
    ):
        super().__init__(inner.n_max)
        self.inner, self.others, self.costs, self.record, self.clock = inner, others, costs, record, clock
        self.sleep = inner.sleep
        self._held_at: Optional[float] = None  # when the step decided here began
        self._k = self._due = self._warm = 0  # N beside others; steps until the next decision; warm-up left

    def begin(self, t_consumer: float) -> None:
        self.inner.can_sleep = self.can_sleep
        self.record.clocked(*self.clock())
        self.inner.begin(t_consumer)

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        now = time.perf_counter()
        self.record.seen(drafted, accepted)
        self.record.clocked(*self.clock())
        ours = self._held_at is not None
        if ours:
            self.inner.foreign(now - self._held_at)  # type: ignore[operator]
            self._held_at = None
        rows = self.others()
        if rows:
            self._held_at = now
            return self._beside(rows + 1)
        self._due = 0
        if ours:  # (the last step was decided here: the inner policy hears nothing of it)
            drafted = accepted = 0
        n = self.inner.step(drafted, accepted, t_consumer, done)
        self.hold, self.sleep, self.shadow, self.quiet = False, self.inner.sleep, self.inner.shadow, self.inner.quiet
        return n

    def _beside(self, rows: int) -> int:
        if self._due <= 0:
            self._k, self._due = self._decide(rows), LOAD_WINDOW
            self._warm = LOAD_WARM if self._k and self.sleep else 0
        self._due -= 1
        # (hold: the lookup drafts nothing; quiet: held, the target computes no h rows for the head)
        self.hold, self.shadow = True, False
        self.sleep, self.quiet = not self._k, 0 if self._k else 1
        if self._warm:
            self._warm -= 1
            return 0
        return self._k

    def _decide(self, rows: int) -> int:
        acc = self.record.acceptance(self.n_max)
        t1, h = self.costs.plain(), self.record.head_s
        if acc is None or not t1 or h is None or not self.costs.known():
            return 0
        return drafts_beside(rows, acc, self.costs.v, h / t1)

    def shadow_result(self, hit: bool) -> None:
        self.record.seen(1, int(hit))
        self.inner.shadow_result(hit)

    def foreign(self, seconds: float) -> None:
        self.inner.foreign(seconds)

    def end(self, done: int) -> None:
        self.inner.end(done)


__all__ = ["DraftRecord", "LoadGate", "drafts_beside", "LOAD_MARGIN", "LOAD_WARM", "LOAD_WINDOW"]
