"""DraftPolicy: how many tokens the verify loop drafts each step.

The base drafts a fixed N, what the runtime uses when given no policy. Policies that choose N while
generating (mtp_cli.speed.adaptive) live above the runtime and subclass this; the loop calls

    begin(t_consumer)                       a generation's steps follow
    step(drafted, accepted, t_consumer, done) -> N   report the last step, get the next one's N;
                                            then `shadow` and `sleep` say how to run it
    shadow_result(hit)                      after a shadow step: was its one draft token the target's?
    foreign(seconds)                        the last step was drafted by another drafter (a self-sized
                                            lookup beside the policy's), which took this long
    end(done)                               the generation ended after `done` steps
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Optional


class DraftPolicy:
    """A fixed draft length: N = n_max every step."""

    #: this step drafts one token that is compared with the target's token but not verified
    shadow: bool = False
    #: drafting is off for now: a drafter that can resume cold (Drafter.can_sleep) is not called
    sleep: bool = False
    #: steps step() will answer without looking (what it returns, and `sleep`, stay as they are)
    quiet: int = 0
    #: whether the drafter it steers can sleep at all (the loop says so before begin())
    can_sleep: bool = True
    #: this step drafts nothing at all, a self-sized drafter's (the lookup's) included
    hold: bool = False

    def __init__(self, n_max: int):
        self.n_max = int(n_max)

    def begin(self, t_consumer: float) -> None:
        pass

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        return self.n_max

    def shadow_result(self, hit: bool) -> None:
        pass

    def foreign(self, seconds: float) -> None:
        pass

    def end(self, done: int) -> None:
        pass


class LoadGate(DraftPolicy):
    """A sequence's policy while others share its decodes (mtp_cli.slots): then it drafts nothing,
    the lookup included, since where rows cost compute a draft row is a row taken from someone's
    decoding (on 2 cores a batch of 4 rows costs 3 single decodes, and drafting does not pay even
    alone); alone, its own policy decides. The steps it held are that policy's foreign steps (left
    out of what it measures). Drafting by a cost model of batched rows (a GPU's cheap rows) is still
    to come."""

    def __init__(self, inner: DraftPolicy, busy: Callable[[], bool]):
        super().__init__(inner.n_max)
        self.inner, self.busy = inner, busy
        self.sleep = inner.sleep
        self._held_at: Optional[float] = None  # when the step it held began

    def begin(self, t_consumer: float) -> None:
        self.inner.can_sleep = self.can_sleep
        self.inner.begin(t_consumer)

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        now = time.perf_counter()
        if self._held_at is not None:
            self.inner.foreign(now - self._held_at)
            self._held_at = None
        if self.busy():
            self._held_at = now
            # (quiet: the target computes no h rows for it; woken, its head restarts without one)
            self.hold, self.sleep, self.shadow, self.quiet = True, True, False, 1
            return 0
        n = self.inner.step(drafted, accepted, t_consumer, done)
        self.hold, self.sleep, self.shadow, self.quiet = False, self.inner.sleep, self.inner.shadow, self.inner.quiet
        return n

    def shadow_result(self, hit: bool) -> None:
        self.inner.shadow_result(hit)

    def foreign(self, seconds: float) -> None:
        self.inner.foreign(seconds)

    def end(self, done: int) -> None:
        self.inner.end(done)


__all__ = ["DraftPolicy", "LoadGate"]
