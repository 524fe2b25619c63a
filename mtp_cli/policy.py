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
    #: a drafter that sizes its own drafts (the lookup) drafts nothing this step (with N = 0: nothing drafts)
    hold: bool = False
    #: an asleep drafter may be woken in this generation (so it remembers the prompt: Drafter.remembers)
    wakes: bool = True

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


class NoDrafts(DraftPolicy):
    """N = 0 every step, the drafter asleep and a self-sized lookup held: a request's draft length
    of 0 (llama-server's `speculative.n_max` clamped to 0 turns its drafting off). n_max: the
    config's, so that the contexts stay the ones every other request runs on."""

    sleep = True
    hold = True
    wakes = False
    quiet = 1 << 30  # (it never wakes the drafter: the target computes no h rows for it)

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        return 0


__all__ = ["DraftPolicy", "NoDrafts"]
