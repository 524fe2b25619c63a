"""DraftPolicy: how many tokens the verify loop drafts each step.

The base drafts a fixed N, what the runtime uses when given no policy. Policies that choose N while
generating (mtp_cli.speed.adaptive) live above the runtime and subclass this; the loop calls

    begin(t_consumer)                       a generation's steps follow
    step(drafted, accepted, t_consumer, done) -> N   report the last step, get the next one's N;
                                            then `shadow` and `sleep` say how to run it
    shadow_result(hit)                      after a shadow step: was its one draft token the target's?
    foreign(seconds)                        the last step is not the policy's to time (StepClock: a
                                            self-sized lookup's, or one just after another decode)
    end(done)                               the generation ended after `done` steps
"""

from __future__ import annotations

# steps after the prompt's last chunk, and after a lookup's pass, left out of the policy's timing: a plain
# step after a big batch runs slow for a few steps (the demo on a 2-vCPU Xeon: +59%, +37%, +28%, +23%,
# +12% after a prompt; +28% after a lookup's pass), so N = 0 timed at a generation's start read dear
UNTIMED_AFTER_PROMPT, UNTIMED_AFTER_LOOKUP = 4, 1


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


class StepClock:
    """Which of a generation's steps its policy times: not a lookup's (its time is its own), nor the
    first ones after another decode (UNTIMED_AFTER_*): those are told as foreign steps, their tokens'
    emission in, the consumer's time out."""

    def __init__(self) -> None:
        self._unclocked, self._untimed = False, 0  # the step that ended is not timed; how many to come aren't
        self._t = self._tc = 0.0  # when the current step began; the consumer's time then

    def prompt_done(self) -> None:
        self._untimed = UNTIMED_AFTER_PROMPT

    def settled(self, lookup: bool) -> None:
        """A step was verified (lookup: a self-sized drafter drafted it)."""
        self._unclocked = lookup or self._untimed > 0
        self._untimed = max(self._untimed - 1, UNTIMED_AFTER_LOOKUP if lookup else 0)

    def tick(self, policy: DraftPolicy, now: float, t_consumer: float) -> None:
        """A step begins (or the generation ends) at `now`: the one that ended, if untimed, is foreign."""
        if self._unclocked:
            policy.foreign(now - self._t - (t_consumer - self._tc))
            self._unclocked = False
        self._t, self._tc = now, t_consumer


__all__ = ["DraftPolicy", "NoDrafts", "StepClock", "UNTIMED_AFTER_LOOKUP", "UNTIMED_AFTER_PROMPT"]
