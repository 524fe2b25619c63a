"""Drafting by load: a sequence's draft length while other sequences share its decodes (mtp_cli.slots).

What a row of a batch costs is this machine's: on a 2-core CPU every row is compute (on the AMD EPYC
a decode of the demo's 4 rows costs about 2.6 one-row decodes), on a GPU a few rows more cost next
to nothing. So beside others a sequence drafts k tokens only where what they promise pays for the
rows they add to the shared decode and for its drafter's time. With R rows in the step (its own last
token and the others' rows of their last step, D of them drafts) giving Y tokens (its own and what
the others' last step gave: a prompt chunk of theirs counts as one row and one token, since this
one's drafts do not slow that prompt more than a row each), the step takes T = v(R - 1) + D h (the
others' drafters' time: each is charged its share of the head decodes they share), and

    (Y + sum(acc[:k])) / (T + k (m + h))  >  margin * Y / T

v: StepCosts, a decode of n + 1 rows over a one-row decode, learned from every step's decode; m: a
row's cost, the larger of v's slope and the mean cost of the rows past the first (the fitted line's
slope alone, drawn by a few noisy points and the prior, put a row at 0.2 of a decode on the AMD EPYC
where it cost 0.8, and had 2-row steps drafting); acc: the sequence's acceptance by draft position
(DraftRecord, kept across its generations); h: its drafter's time per draft over a one-row target
decode (what its drafting steps took, catch-up included, per token drafted; 0 for a drafter that
decodes nothing). margin: LOAD_MARGIN to start drafting, 1 to go on (a switch costs a warm-up).
Costs not yet measured: no drafts. A drafter never timed or too little acceptance evidence (a slot
that has never been alone): after LOAD_PROBE_GAP such steps beside others, a probe of
LOAD_PROBE_STEPS steps drafting max(1, n_min), if perfect drafts from a free drafter would pay at all
(on the AMD EPYC only at 2-3 rows); a probe that leaves it without evidence doubles the wait. Alone,
the sequence's own policy decides.
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
LOAD_WARM = 2  # an asleep head follows this many steps before it drafts beside others (as adaptive.WARM_STEPS)
LOAD_EVIDENCE = 16.0  # decayed first-draft counts below which a sequence's acceptance is unknown
POS_EVIDENCE = 4.0  # ... below which a later position's is continued from the earlier ones (geometric)
LOAD_PROBE_GAP = 256  # steps beside others without evidence before a probe (short runs never pay for one)
LOAD_PROBE_GAP_MAX = 8192  # ... doubling after each probe that left it without (short generations, n_min)
LOAD_PROBE_STEPS = 26  # a probe's steps beside others, warm-up included (24 drafts: the evidence asked for)
GAMMA = 0.99  # per drafted step: acceptance evidence halves in ~69 of them
HEAD_DECAY = 0.1  # weight of a new drafter decode time in its mean

Clock = Callable[[], float]  # the seconds a drafter decoded this generation
Others = Callable[[], tuple[int, int, int]]  # (rows, tokens, drafts) of the others' last step; (0, 0, 0): alone


@dataclass
class DraftRecord:
    """What a sequence's drafted steps showed, kept across its generations by the runner: decayed
    counts of draft position i drafted and accepted, and its drafter's mean seconds per token drafted."""

    drafted: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    head_s: Optional[float] = None
    _last: Optional[float] = None  # the drafter's seconds at the last step (None: a generation began)
    _prev = 0  # the drafts of the step before the last
    unknown: int = 0  # steps beside others without evidence since the last probe
    gap: int = LOAD_PROBE_GAP  # ... before the next probe
    probe: int = 0  # steps beside others the running probe has left

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

    def begin(self) -> None:
        """A generation begins: its drafter's seconds restart."""
        self._last, self._prev = None, 0

    def clocked(self, seconds: float, k: int) -> None:
        """The drafter's seconds this generation, now that a step drafting k tokens is over. Timed
        only after a drafting step: the first after steps without drafts also decodes their catch-up
        rows (a generation's first, its prompt's; in a chain, the lookup's accepted drafts)."""
        t0, self._last = self._last, seconds
        prev, self._prev = self._prev, k
        if t0 is None or seconds < t0 or k <= 0 or prev <= 0:
            return
        per = (seconds - t0) / k
        self.head_s = per if self.head_s is None else self.head_s + HEAD_DECAY * (per - self.head_s)

    def acceptance(self, n: int) -> Optional[list[float]]:
        """P(draft position i is kept), i < n, non-increasing, continued geometrically past the
        positions seen; None with too little evidence."""
        if not self.drafted or self.drafted[0] < LOAD_EVIDENCE:
            return None
        out: list[float] = []
        for i in range(n):
            seen = i < len(self.drafted) and self.drafted[i] >= POS_EVIDENCE
            p = self.accepted[i] / self.drafted[i] if seen else (out[-1] * out[0] if out else 0.0)
            out.append(min(p, out[-1]) if out else p)
        return out


def drafts_beside(
    rows: int,
    tokens: int,
    acc: Sequence[float],
    v: Callable[[int], float],
    h: float,
    margin: float = LOAD_MARGIN,
    drafted: int = 0,
    n_min: int = 1,
) -> int:
    """The draft length k <= len(acc) for a sequence whose step shares a decode of `rows` rows giving
    `tokens` tokens (its own row and token included; `drafted` of the rows the others' drafts) that
    gives the most tokens per unit of time, if that beats the step without its drafts by `margin`;
    else 0 (see the module docstring). Fewer than n_min drafts are not drafted (llama.cpp's n_min)."""
    decode = v(rows - 1)
    row = max(v(rows) - decode, (decode - 1.0) / (rows - 1) if rows > 1 else 0.0)
    now = decode + drafted * h
    best, top, gain = 0, margin * tokens / now, 0.0
    for k in range(1, len(acc) + 1):
        gain += acc[k - 1]
        rate = (tokens + gain) / (now + k * (row + h))
        if rate > top and k >= n_min:
            best, top = k, rate
    return best


class LoadGate(DraftPolicy):
    """A sequence's policy in a runner that batches several (mtp_cli.slots). Alone, its own policy
    (`inner`) decides; beside others (`others()`: the rows, tokens and drafts of their last step,
    (0, 0, 0) alone), every LOAD_WINDOW steps drafts_beside does, for the policy's drafter: a text lookup
    (self-sized) drafts nothing then, its costs weighed as if alone. An asleep head follows LOAD_WARM
    steps before it drafts. The steps decided here are the inner policy's foreign ones (left out of
    what it measures); their acceptance is the record's. clock: the drafter's decode seconds this
    generation, None for one that decodes nothing (h = 0)."""

    def __init__(
        self,
        inner: DraftPolicy,
        others: Others,
        costs: StepCosts,
        record: DraftRecord,
        clock: Optional[Clock],
        n_min: int = 1,
    ):
        super().__init__(inner.n_max)
        self.inner, self.others, self.costs, self.record, self.clock = inner, others, costs, record, clock
        self.n_min = max(1, n_min)  # (drafts shorter than this are discarded: a probe drafts this many)
        self.sleep, self.wakes = inner.sleep, inner.wakes
        self._held_at: Optional[float] = None  # when the step decided here began
        self._k = self._due = self._warm = 0  # N beside others; steps until the next decision; warm-up left

    def start(self) -> None:
        """Before its loop begins, beside others: the decision, for a window; where drafts would not
        pay the drafter follows none of the prompt (asleep: no catch-up, no h rows for it), else all
        of it (awake: no warm-up)."""
        rows, tokens, drafted = self.others()
        if rows:
            self._k, self._due = self._decide(rows + 1, tokens + 1, drafted, LOAD_MARGIN), LOAD_WINDOW
            self.sleep = not self._k

    def begin(self, t_consumer: float) -> None:
        self.inner.can_sleep = self.can_sleep
        self.record.begin()
        self.inner.begin(t_consumer)

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        now = time.perf_counter()
        self.record.seen(drafted, accepted)
        if self.clock is not None:
            self.record.clocked(self.clock(), drafted)
        ours = self._held_at is not None
        self._foreign(now)
        rows, tokens, theirs = self.others()
        if rows:
            self._held_at = now
            return self._beside(rows + 1, tokens + 1, theirs)
        self._due = self._k = self._warm = 0
        if ours:  # (the last step was decided here: the inner policy hears nothing of it)
            drafted = accepted = 0
        n = self.inner.step(drafted, accepted, t_consumer, done)
        self.hold, self.sleep, self.shadow, self.quiet = False, self.inner.sleep, self.inner.shadow, self.inner.quiet
        return n

    def _foreign(self, now: float) -> None:
        """The step decided here that just ended is the inner policy's foreign one."""
        if self._held_at is not None:
            self.inner.foreign(now - self._held_at)
            self._held_at = None

    def _beside(self, rows: int, tokens: int, drafted: int) -> int:
        rec = self.record
        if rec.probe:  # (a probe's steps beside others, warm-up included: it ends, evidence or not)
            rec.probe -= 1
            if not rec.probe and not self._known():
                rec.gap = min(2 * rec.gap, LOAD_PROBE_GAP_MAX)
        elif not self._known():
            rec.unknown += 1
        if self._due <= 0:
            margin = 1.0 if self._k else LOAD_MARGIN  # (to go on drafting it need only pay)
            self._k, self._due = self._decide(rows, tokens, drafted, margin), LOAD_WINDOW
            self._warm = LOAD_WARM if self._k and self.sleep and self.can_sleep else 0
        self._due -= 1
        # (hold: the lookup drafts nothing; quiet: held, the target computes no h rows for the head)
        self.hold, self.shadow = True, False
        self.sleep, self.quiet = not self._k, 0 if self._k else 1
        if self._warm:
            self._warm -= 1
            return 0
        return self._k

    def _decide(self, rows: int, tokens: int, drafted: int, margin: float) -> int:
        acc = self.record.acceptance(self.n_max)
        t1 = self.costs.plain()
        h = self.record.head_s if self.clock is not None else 0.0
        if not t1 or not self.costs.known():
            return 0
        if acc is None or h is None:
            return self.n_min if self._probes(rows, tokens, drafted) else 0
        return drafts_beside(rows, tokens, acc, self.costs.v, h / t1, margin, drafted, self.n_min)

    def _known(self) -> bool:
        """Whether the record knows what this slot's drafts give and cost."""
        return self.record.acceptance(1) is not None and (self.clock is None or self.record.head_s is not None)

    def _probes(self, rows: int, tokens: int, drafted: int) -> bool:
        """Whether a probe's drafts run now to learn what this slot's drafts give (a probe runs, or one
        is due and perfect drafts of a free drafter would pay)."""
        rec = self.record
        if rec.probe:
            return True
        if rec.unknown < rec.gap:
            return False
        rec.unknown = 0
        perfect = [1.0] * self.n_max
        if not drafts_beside(rows, tokens, perfect, self.costs.v, 0.0, LOAD_MARGIN, drafted, self.n_min):
            return False
        rec.probe = LOAD_PROBE_STEPS
        return True

    def shadow_result(self, hit: bool) -> None:
        self.record.seen(1, int(hit))
        self.inner.shadow_result(hit)

    def foreign(self, seconds: float) -> None:
        self._held_at = None  # (a step decided here that the loop also leaves untimed: told once, the loop's time)
        self.inner.foreign(seconds)

    def end(self, done: int) -> None:
        self._foreign(time.perf_counter())
        self.inner.end(done)


__all__ = [
    "DraftRecord",
    "LoadGate",
    "drafts_beside",
    "LOAD_MARGIN",
    "LOAD_PROBE_GAP",
    "LOAD_PROBE_GAP_MAX",
    "LOAD_PROBE_STEPS",
    "LOAD_WARM",
    "LOAD_WINDOW",
]
