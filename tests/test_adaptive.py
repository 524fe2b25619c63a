"""The adaptive controller (mtp_cli.speed.adaptive) on its own, with injected costs (never wall time),
and auto / adaptive in the runtime (mtp_cli.speed.auto): plain decoding's tokens, learning kept
across generations, the tuned profile when there is one. One thread.
"""

from __future__ import annotations

import json
import random

import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.policy import UNTIMED_AFTER_PROMPT, DraftPolicy
from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.adaptive import (
    GAP_START,
    PROBE_BUDGET,
    PROBE_STEPS,
    SWITCH_MARGIN,
    WARM_STEPS,
    AdaptiveController,
)
from mtp_cli.speed.auto import NO_PROFILE_NOTE, AutoDraft
from mtp_cli.speed.evidence import COST_DOUBT, Evidence
from tests.speedkit import FLAT, _profile, greedy, run_cli, tokens


@pytest.fixture(scope="session")
def models(tiny_models):
    return lambda arch="glm4moe", **kw: tiny_models(arch, "structured", "q8_0", **kw)


def simulate(ctl: AdaptiveController, alpha: float, steps: int, seed: int = 0, on_step=None) -> int:
    """`steps` steps of a head whose drafts are each right with probability alpha; on_step(n) after
    each step() call (e.g. to advance a fake clock). The tokens they gave."""
    rng = random.Random(seed)
    k = a = -1
    tokens = 0
    ctl.begin(0.0)
    for done in range(steps):
        n = ctl.step(k, a, 0.0, done)  # (answered without looking while drafting is off)
        if on_step is not None:
            on_step(n)
        if ctl.shadow:  # the runtime drafts one token, verifies none, reports the comparison
            ctl.shadow_result(rng.random() < alpha)
            k = a = 0
            tokens += 1
            continue
        k = n
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        tokens += 1 + a
    ctl.end(steps)
    return tokens


def test_controller_off_for_a_useless_head_and_probes_rarely():
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    simulate(ctl, 0.0, 2000)
    assert ctl.best == 0 and ctl.sleep
    assert ctl.steps_at[0] > 0.98 * sum(ctl.steps_at)
    assert ctl.n_probes == 0 and ctl.n_shadow <= 15  # shadow steps only; gaps double to GAP_MAX


def test_controller_for_a_drafter_that_cannot_sleep_never_sleeps_nor_warms_up():
    """(n-gram and draft-model drafters: always in step, so a probe needs no warm-up window.)"""
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    ctl.can_sleep = False
    seen = []
    decide = ctl._decide

    def spy(*a):
        n = decide(*a)
        seen.append((ctl.sleep, ctl._warm))
        return n

    ctl._decide = spy  # type: ignore[method-assign]
    simulate(ctl, 0.0, 600)
    assert ctl.n_shadow >= 2 and seen and all(s == (False, None) for s in seen)


def test_controller_climbs_for_a_good_head():
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    simulate(ctl, 0.95, 600)
    assert ctl.best >= 4 and not ctl.sleep
    assert sum(ctl.steps_at[3:]) > 0.7 * sum(ctl.steps_at)


def test_controller_climbs_past_settings_that_lose_even_with_probes_far_apart():
    """A fixed cost per drafting step (a head across a slow link): N = 1, 2 lose, N >= 3 wins (N = 7
    best). Probes climb one past the largest N probed, which does not decay while they wait."""
    costs = [1.0] + [2.2 + 0.05 * n for n in range(1, 9)]
    for seed in range(3):
        ctl = AdaptiveController(8, costs=costs, measure=False)
        simulate(ctl, 0.7, 6000, seed)
        assert ctl.best >= 5, (seed, ctl.describe())


def test_controller_stops_when_drafting_cannot_pay():
    # a compute-bound machine: one draft costs more than the best case gains (cost(1) > 2 cost(0), ...)
    costs = [1.0] + [1.0 + 1.2 * n for n in range(1, 9)]
    ctl = AdaptiveController(8, costs=costs, measure=False)
    simulate(ctl, 1.0, 1000)
    assert ctl.best == 0 and ctl.n_probes <= 2


def test_controller_follows_a_change_in_the_text():
    ctl = AdaptiveController(4, costs=FLAT[:5], measure=False)
    simulate(ctl, 0.0, 300)
    assert ctl.best == 0
    simulate(ctl, 0.97, 1500, seed=1)  # the text became predictable: found again by probing
    assert ctl.best >= 2
    simulate(ctl, 0.0, 500, seed=2)  # and unpredictable again (evidence halves every ~69 steps)
    assert ctl.best == 0


def simulate_timed(ctl: AdaptiveController, alpha: float, steps: int, cost, monkeypatch, seed: int = 0) -> float:
    """simulate() on a fake clock: each step takes cost(n, asleep, shadow) seconds; the time per token
    (what plain decoding's step costs: a drafting step that gave three tokens is not one step's worth)."""
    clock = [0.0]
    monkeypatch.setattr("mtp_cli.speed.adaptive._now", lambda: clock[0])

    def tick(n: int) -> None:
        clock[0] += cost(n, ctl.sleep, ctl.shadow)

    return clock[0] / simulate(ctl, alpha, steps, seed, on_step=tick)


@pytest.mark.parametrize("in_step", [1.01, 1.33])
def test_an_off_drafter_sleeps_whatever_staying_in_step_costs(monkeypatch, in_step):
    """A good head on a slow RPC link where drafting still loses (every draft step 2.3x a plain one):
    off, it sleeps but for the probes' warm-ups, whether an off drafter kept in step pays the h rows'
    round trip (1.33x) or almost nothing (1.01x: over RPC at 0 ms one noisy window said so, and the
    head stayed in step for a whole run at 0.94x plain)."""

    slept = [0]

    def cost(n: int, asleep: bool, shadow: bool) -> float:
        if shadow:  # a plain step in step (its h rows), and one decode of the head on this side of the link
            return 0.02 * (in_step + 0.2)
        if n:
            return 0.02 * (2.3 + 0.3 * n)
        slept[0] += asleep
        return 0.02 * (1.0 if asleep else in_step)

    ctl = AdaptiveController(8)
    per = simulate_timed(ctl, 0.7, 3000, cost, monkeypatch)
    assert ctl.best == 0 and ctl.n_shadow + ctl.n_probes >= 2
    assert slept[0] > 0.9 * 3000 and per < 0.02 * 1.06 and ctl.cost(0) < 0.02 * 1.02


def test_settings_within_a_few_percent_do_not_make_it_switch_back_and_forth():
    """N = 1, 2 and 3 within 2% of each other: a few steps' noise no longer moves the best each
    time (each switch rebuilds llama.cpp's graphs; over RPC the best switched 7-8 times in 140
    steps). 48 switches in three runs of 2000 steps before; a measured setting now has to be 3% better."""
    switches = 0
    for seed in range(3):
        ctl = AdaptiveController(4, costs=[1.0, 1.5, 2.0, 2.0 * 2.952 / 2.44, 3.5], measure=False)
        simulate(ctl, 0.8, 2000, seed=seed)
        assert ctl.best in (1, 2, 3)
        switches += ctl.n_switches
    assert switches < 25


def test_the_switching_margin_never_holds_a_setting_slower_than_plain_decoding():
    ctl = AdaptiveController(3)
    ctl.best = 2
    ctl._update_best([1.0, None, 1.01, 1.02], 2)  # (N = 3 only 1% better: N = 2 stays)
    assert ctl.best == 2
    ctl._update_best([1.0, None, 0.99, 1.01], 2)  # (N = 2 now below plain decoding: the better N takes over)
    assert ctl.best == 3


def test_a_deeper_n_seen_in_a_probe_replaces_the_best_only_past_one_miss_more():
    """Positions only a larger N drafts are seen in its probes' few steps: it replaces the best judged
    with one miss more than seen there (DEEP_DOUBT). Over RPC one 3-step probe of N = 3 over easy text
    took its third draft from 53% to 70% right, and N = 3, 3-4% slower than N = 2 there, stayed."""
    ctl = AdaptiveController(3)
    ctl.ev.add_cost(0, 0.020, 50)
    ctl.ev.add_cost(2, 0.0354, 100)
    ctl.ev.add_cost(3, 0.0432, 4)
    ctl.best = 2
    ctl.ev.D[:], ctl.ev.A[:] = [60.0, 60.0, 5.5], [53.4, 46.2, 4.3]
    thr = ctl.throughput()
    assert thr[3] > SWITCH_MARGIN * thr[2]  # type: ignore[operator]  # (the point estimates would switch)
    ctl._update_best(thr, 2)
    assert ctl.best == 2
    ctl.ev.D[2], ctl.ev.A[2] = 40.0, 30.0  # (its third draft seen right as often over many steps)
    ctl._update_best(ctl.throughput(), 2)
    assert ctl.best == 3


def test_a_head_that_cannot_pay_here_costs_little(monkeypatch):
    """A head that hits 70% on a machine where every verify pass costs 2 plain steps and more (this
    2-core CPU's kind): no N pays at any acceptance it may have, so it sleeps (staying in step
    only keeps it fair for probes that are not coming) and is probed within the budget. Before: in
    step half the time and probed 12 times in 3000 steps, 4.7% over plain decoding per step. Per
    token, over 30 seeds: 1.4% before interpolated costs and shadow probes that end once settled, 1.2% since."""
    per, slept = [], [0]

    def cost(n: int, asleep: bool, shadow: bool) -> float:
        if shadow:
            return 0.02 * 1.2
        if n:
            return 0.02 * (2.0 + 0.3 * n)
        slept[0] += asleep
        return 0.02 * (1.0 if asleep else 1.02)

    for seed in range(5):
        slept[0] = 0
        ctl = AdaptiveController(8)
        per.append(simulate_timed(ctl, 0.7, 3000, cost, monkeypatch, seed) / 0.02)
        assert ctl.best == 0 and slept[0] > 0.8 * 3000, (seed, ctl.describe())
    assert max(per) < 1.03 and sum(per) / len(per) < 1.02, per


def scripted(ctl: AdaptiveController, hits: list[bool], alpha: float, steps: int) -> int | None:
    """simulate() whose shadow steps first answer from `hits`; the first step drafting for real."""
    rng, script = random.Random(0), iter(hits)
    k = a = -1
    first_on = None
    ctl.begin(0.0)
    for done in range(steps):
        n = ctl.step(k, a, 0.0, done)
        if ctl.shadow:
            hit = next(script, None)
            ctl.shadow_result(rng.random() < alpha if hit is None else hit)
            k = a = 0
            continue
        if n and first_on is None:
            first_on = done
        k, a = n, 0
        while a < k and rng.random() < alpha:
            a += 1
    ctl.end(steps)
    return first_on


def test_a_good_heads_first_shadow_miss_does_not_keep_it_off():
    """A shadow probe is SHADOW_STEPS steps: an 86% head whose first shadow draft misses is probed
    for real right after it (judged on one step, it waited for the next shadow probe, twice as far)."""
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    first_on = scripted(ctl, [False, True, True, True], 0.86, 200)
    assert first_on is not None and first_on <= 20 + 4 and ctl.best >= 4, (first_on, ctl.describe())


def test_one_shadow_hit_in_four_earns_no_real_probe():
    """A shadow probe's hit rate is judged with one miss more than it saw (HIT_DOUBT): 1 of 4 is 0.2,
    below SHADOW_RATE, where drafting would need more to pay: no real probe follows it."""
    costs = [1.0] + [1.3 + 0.05 * n for n in range(1, 9)]
    ctl = AdaptiveController(8, costs=costs, measure=False)
    scripted(ctl, [True, False, False, False], 0.0, 60)
    assert ctl.n_shadow >= 1 and ctl.n_probes == 0 and ctl.best == 0, ctl.describe()


def test_a_shadow_probe_ends_once_its_verdict_is_settled():
    """Two hits in two already earn a real probe (2 of 5 with the doubt's miss, whatever follows),
    and three misses in three none: the probe ends there, not after SHADOW_STEPS."""
    for hits, shadows, real in (
        ([True, True], 2, True),
        ([False, False, False], 3, False),
        ([True, False, False], 4, True),
    ):
        ctl = AdaptiveController(8, costs=FLAT, measure=False)
        script = iter(hits + [True, True])
        k = a = -1
        seen = 0
        ctl.begin(0.0)
        for done in range(40):
            n = ctl.step(k, a, 0.0, done)
            if ctl.shadow:
                ctl.shadow_result(next(script))
                seen += 1
                k = a = 0
                continue
            if seen:
                break
            k, a = n, 0
        assert seen == shadows and (ctl.n_probes > 0 or n > 0) == real, (hits, seen, ctl.describe())


def test_only_a_real_probe_of_an_asleep_head_waits_for_a_warm_up():
    """A shadow probe asks a 25% hit rate, which a head re-reading the prompt's rows has at once: it
    starts as the head wakes. A real probe of a sleeping head (its hit rate known) warms it up first."""
    ctl = AdaptiveController(8, costs=FLAT, measure=False)
    ctl.begin(0.0)
    seen = []
    for done in range(GAP_START + 1):
        n = ctl.step(0, 0, 0.0, done)
        seen.append((n, ctl.shadow, ctl._warm))
    assert seen[:GAP_START] == [(0, False, None)] * GAP_START and seen[GAP_START] == (1, True, None)

    ctl = AdaptiveController(8)  # (costs measured: a probe, not a switch on given costs)
    ctl.ev.fold([0, 10, 0, 0, 0, 0, 0, 0, 0, 0], [2, 8, 0, 0, 0, 0, 0, 0, 0, 0])  # (8 of 10 first drafts right)
    ctl.begin(0.0)
    seen = []
    for done in range(GAP_START + WARM_STEPS + 1):
        n = ctl.step(0, 0, 0.0, done)
        seen.append((n, ctl.sleep, ctl._warm is not None))
    assert seen[GAP_START - 1] == (0, True, False)
    assert seen[GAP_START : GAP_START + WARM_STEPS] == [(0, False, True)] * WARM_STEPS  # (awake, in step)
    assert seen[-1][0] >= 1 and not ctl.shadow and ctl.n_probes == 1


def to_a_probes_timed_steps(monkeypatch) -> tuple[AdaptiveController, int, int, list[float]]:
    """A fresh controller (plain decoding measured) stepped on a fake clock up to a real probe's timed
    steps: it, the probe's N, the steps done, the clock."""
    clock = [0.0]
    monkeypatch.setattr("mtp_cli.speed.adaptive._now", lambda: clock[0])
    ctl = AdaptiveController(8)
    ctl.ev.add_cost(0, 0.01, 50)
    ctl.begin(0.0)
    n, done = 0, 0
    while not (ctl._probing == 2 and not ctl.shadow):
        n = ctl.step(n, n, 0.0, done)
        if ctl.shadow:
            ctl.shadow_result(True)
        clock[0] += 0.01 * (1 + n)
        done += 1
    return ctl, n, done, clock


def test_a_probe_whose_timed_steps_a_generations_end_dropped_is_timed_again(monkeypatch):
    """A generation's end drops its partial window's time: a probe timed there measured nothing. It runs
    its timed steps again (once) in the next generation, instead of counting as a look that found nothing."""
    ctl, n, done, clock = to_a_probes_timed_steps(monkeypatch)
    assert n >= 1 and ctl.cost(n) is None
    ctl.end(done + PROBE_STEPS)  # (the generation ended inside the probe's timed steps)
    ctl.begin(0.0)
    # timed again, at the same N, past the steps the loop leaves untimed at a generation's start (slow ones)
    for d in range(UNTIMED_AFTER_PROMPT + PROBE_STEPS - 1):
        assert ctl.step(n, n, 0.0, d) == n and ctl._probing == 2, d
        t = 0.01 * (1 + n) * (3.0 if d < UNTIMED_AFTER_PROMPT else 1.0)
        clock[0] += t
        if d < UNTIMED_AFTER_PROMPT:
            ctl.foreign(t)
    ctl.step(n, n, 0.0, UNTIMED_AFTER_PROMPT + PROBE_STEPS - 1)
    assert ctl.cost(n) == pytest.approx(0.01 * (1 + n))


def test_a_probe_cut_early_by_a_generations_end_is_timed_again_from_the_next_ones_start(monkeypatch):
    """A generation that ends a step into a probe's timed steps drops their time: the next one re-times
    them from its first step (judged on what its steps after the cut happened to time, it was 1-2 steps)."""
    ctl, n, done, _ = to_a_probes_timed_steps(monkeypatch)
    ctl.end(done + 1)  # (one timed step ran)
    ctl.begin(0.0)
    assert ctl.step(n, n, 0.0, 0) == n and ctl._probing == 2 and ctl._retimed


def generations(ctl: AdaptiveController, count: int, length: int, monkeypatch) -> dict[str, list[int]]:
    """`count` generations of `length` steps on a fake clock, a head right 80% of the time, the first
    UNTIMED_AFTER_PROMPT steps of each reported foreign as the loop's StepClock does: where real probes
    started (step within their generation), those whose N's cost evidence had not grown when they
    ended, the longest run of generations a probe stayed pending (_warm) across."""
    clock = [0.0]
    monkeypatch.setattr("mtp_cli.speed.adaptive._now", lambda: clock[0])
    rng = random.Random(3)
    seen: dict[str, list[int]] = {"starts": [], "unmeasured": [], "pending": [0]}
    k = a = -1
    pending, probe = 0, None
    for _ in range(count):
        ctl.begin(0.0)
        for done in range(length):
            probes = ctl.n_probes
            n = ctl.step(k, a, 0.0, done)
            if probe is not None and (not ctl._probing or ctl.n_probes > probes):  # (it ended)
                if ctl.ev.C[probe[0]] <= probe[1]:
                    seen["unmeasured"].append(probe[0])
                probe = None
            if ctl.n_probes > probes:
                seen["starts"].append(done)
                probe = (n, ctl.ev.C[n])
            t = 0.01 if ctl.shadow or not n else 0.01 * (1.2 + 0.15 * n)
            clock[0] += t
            if done < UNTIMED_AFTER_PROMPT:
                ctl.foreign(t)
            if ctl.shadow:
                ctl.shadow_result(rng.random() < 0.8)
                k = a = 0
                continue
            k, a = n, 0
            while a < k and rng.random() < 0.8:
                a += 1
        ctl.end(length)
        pending = pending + 1 if ctl._warm is not None else 0
        seen["pending"][0] = max(seen["pending"][0], pending)
    return seen


def test_a_probe_due_in_a_generations_untimed_opening_starts_as_it_ends(monkeypatch):
    """The loop times none of a generation's first UNTIMED_AFTER_PROMPT steps: a probe due there runs
    the best N until its own (untimed) first step is the opening's last, so its timed steps are timed
    (started at a generation's first step, over RPC a probe of N = 4 ran its three timed steps twice)."""
    seen = generations(AdaptiveController(8), 60, 12, monkeypatch)
    assert len(seen["starts"]) >= 3 and min(seen["starts"]) == UNTIMED_AFTER_PROMPT - 1, seen
    assert not seen["unmeasured"], seen


def test_generations_barely_longer_than_their_opening_still_get_probes(monkeypatch):
    """A probe waits out a generation's opening at most once (a generation may end inside it): with
    one timed step a generation, probes still start, and nothing stays pending (before, what shadow
    steps in an opening saw was dropped with their window: 6 shadow probes in 300 generations, no real one)."""
    ctl = AdaptiveController(8)
    seen = generations(ctl, 300, UNTIMED_AFTER_PROMPT + 1, monkeypatch)
    assert seen["pending"][0] <= 2 and ctl.n_probes >= 3, (seen, ctl.describe())


def test_what_untimed_steps_drafted_is_acceptance_evidence():
    """A window of steps the loop left untimed (foreign) has no time to measure, but its drafts were
    accepted or not all the same: kept (before, dropped with the window)."""
    ctl = AdaptiveController(8, start=2)
    ctl.begin(0.0)
    assert ctl.step(-1, -1, 0.0, 0) == 2
    for done in range(1, UNTIMED_AFTER_PROMPT + 1):
        ctl.foreign(0.01)
        ctl.step(2, 2, 0.0, done)
    assert ctl.ev.D[:2] == [UNTIMED_AFTER_PROMPT] * 2 and ctl.ev.hit_rate() == 1.0


def test_a_probe_beside_a_drafting_best_waits_for_all_it_lost():
    """Its cost is doubted (COST_DOUBT) only where a probe may turn drafting on: between two drafting
    N what it lost is what it cost (over RPC at 5 ms a probe of N = 4 read 14% dear, was doubted to
    a loss of nothing and probed again every ~50 steps: 6% of a row's time)."""
    ctl = AdaptiveController(3)
    ctl.ev.add_cost(0, 0.01, 200)
    ctl.ev.add_cost(2, 0.015, 200)
    ctl.ev.fold([0, 0, 0, 100, 0], [20, 20, 20, 40, 0])  # N = 3 drafted 100 times
    ctl.best = 2
    acc = ctl.acceptance()
    loss = 0.02 / 0.015 - (1.0 + sum(acc[:3])) / (1.0 + sum(acc[:2]))
    assert loss > 0.1
    assert ctl._probe_wait(3, 0.02) == pytest.approx(PROBE_STEPS * loss / PROBE_BUDGET, rel=0.01)


def test_an_unmeasured_n_between_two_measured_costs_their_line():
    """Over RPC (5 ms) plain decoding read 25 ms, N = 2 57 ms and N = 1 was not measured: a line up
    from plain decoding (10% per N) made N = 1 look cheap, and it was probed (46 ms: a loss) before
    N = 3, the setting that paid; the gap doubled after it, and N = 3 waited 20 more steps."""
    ctl = AdaptiveController(8)
    ctl.ev.add_cost(0, 0.0254, 8)
    ctl.ev.add_cost(2, 0.0567, 7)
    ctl.ev.fold([0, 0, 11, 0, 0, 0, 0, 0, 0, 0], [2, 2, 7, 0, 0, 0, 0, 0, 0, 0])  # N = 2: 9 / 7 of 11 right
    ctl.best = ctl._climbed = 2
    measured = [ctl.cost(n) for n in range(9)]
    assert ctl.ev.cost_optimistic(1, measured) == pytest.approx((0.0254 + 0.0567) / 2, rel=0.01)
    assert ctl.ev.promising(ctl.throughput(), ctl.best, ctl._climbed) == 3


def test_a_cost_measured_over_few_steps_is_doubted_when_choosing_a_probe():
    """Three timed steps may read a setting dear (a preempted step, a slow round trip): its optimistic
    cost is COST_DOUBT / sqrt(steps) below the measured one; hundreds of steps are taken nearly as read."""
    ev = Evidence(2, None, True)
    ev.add_cost(0, 0.01, 200)
    ev.add_cost(1, 0.03, 3)
    measured = [ev.cost(0), ev.cost(1), None]
    assert ev.cost_optimistic(1, measured) < 0.03 * (1 - COST_DOUBT / 2)
    assert ev.cost_optimistic(0, measured) > 0.01 * (1 - COST_DOUBT / 10)


def test_a_probes_wait_counts_the_tokens_it_gave():
    """A probe costs what its steps lost against the best setting for the tokens they gave (over RPC
    N = 2 costs 2 plain steps and gives 2.4 tokens): one that kept pace asks no wait, one that lost
    waits in proportion, for all of its PROBE_STEPS (one step's loss was the budget's 1/4: on 2 cores
    a head that could never pay was probed 12 times in 3000 steps, 4% of the time)."""
    ctl = AdaptiveController(2)
    ctl.ev.add_cost(0, 0.01, 200)  # plain decoding, the best
    ctl.ev.fold([0, 0, 100, 0], [30, 21, 49, 0])  # N = 2 drafted 100 times: 70 / 49 first / both right
    gives = 1.0 + sum(ctl.acceptance())
    assert 2.1 < gives < 2.3
    assert ctl._probe_wait(2, 0.01 * gives) < 1.0
    dear = ctl._probe_wait(2, 0.03)
    doubt = 1.0 - COST_DOUBT / (PROBE_STEPS - 1) ** 0.5  # (its three timed steps, doubted as its promise was)
    assert dear == pytest.approx(PROBE_STEPS * (3.0 * doubt - gives) / PROBE_BUDGET, rel=0.01)
    ctl.ev.add_cost(2, 0.03, 300)  # (N = 2 measured dear for hundreds of steps: taken nearly as read)
    assert ctl._probe_wait(2, 0.03) > 0.9 * PROBE_STEPS * (3.0 - gives) / PROBE_BUDGET


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_adaptive_greedy_equals_plain(models, arch):
    """Switching N every few steps, sleeping and restarting the head: still plain decoding's tokens."""
    s = models(arch, head_noise=1.0, trunk_mix=2.0)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world")
        ref = tokens(rt, prompt, greedy(n_predict=120))
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False, start=2)
        out = tokens(rt, prompt, greedy(n_predict=120, spec_type="mtp"), "adaptive", ctl)
        assert out == ref
        assert rt.stats.n_drafted > 0 and 0 < rt.stats.n_accepted < rt.stats.n_drafted
        assert ctl.n_switches >= 1 and len([n for n in ctl.steps_at if n]) >= 2  # it did change N
        # off most of the time on a useless head (sleep / restart on every probe), same tokens
        u = models(arch, head_noise=8.0, trunk_mix=2.0)
    with Runtime.load(u["full"], spec_type="mtp") as rt:
        ref = tokens(rt, prompt, greedy(n_predict=120))
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False)
        assert tokens(rt, prompt, greedy(n_predict=120, spec_type="mtp"), "adaptive", ctl) == ref
        # mostly shadow probes (a lucky hit earns a real one), each after a warm-up with the head in step
        assert ctl.n_shadow >= 2 and ctl.n_probes <= 3 and ctl.best == 0 and ctl.steps_at[0] > 0.8 * sum(ctl.steps_at)
        # off but kept in step (may_sleep=False: the drafters' catch-up path): same tokens
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False, may_sleep=False)
        assert tokens(rt, prompt, greedy(n_predict=120, spec_type="mtp"), "adaptive", ctl) == ref
        assert ctl.n_shadow >= 2 and not ctl.sleep


class _Nap(DraftPolicy):
    """Drafting, asleep for steps 2..9 (saying so ahead: `quiet`), drafting again from step 10."""

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.sleep = 2 <= done < 10
        self.quiet = 9 - done if self.sleep else 0
        return 0 if self.sleep else self.n_max


def _warm(rt: Runtime, n_max: int, n_predict: int):
    """A prompt, an mtp config at n_max, plain decoding's tokens for it; the contexts and the drafter
    made by a first generation."""
    prompt = rt.tokenize("hello world")
    cfg = greedy(spec_type="mtp", draft_n_max=n_max, n_predict=n_predict)
    ref = tokens(rt, prompt, greedy(n_predict=n_predict))
    list(rt.generate(prompt, cfg))
    return prompt, cfg, ref


def _spy_h_rows(rt: Runtime, monkeypatch, seen) -> object:
    """seen(on) each time the target context's h rows are switched; the target context."""
    tgt, set_h = rt._ctx.target, lx.set_embeddings_nextn  # type: ignore[union-attr]
    monkeypatch.setattr(lx, "set_embeddings_nextn", lambda c, on, m: (c is tgt and seen(on), set_h(c, on, m)))
    return tgt


def test_an_asleep_drafters_target_computes_no_h_rows(models, monkeypatch):
    """Over RPC fetching the target's h rows is a round trip per decode: while the drafter sleeps the
    target computes none, except in the step before the policy may wake it (whose h row the woken
    head starts from); a generation left asleep resumes cold. Plain decoding's tokens throughout."""
    seen: list[object] = []
    decode, restart = lx.decode, MtpDrafter.restart
    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        prompt, cfg, ref = _warm(rt, 2, 40)
        tgt = _spy_h_rows(rt, monkeypatch, lambda on: seen.append(f"h {on}"))
        monkeypatch.setattr(lx, "decode", lambda c, b: (c is tgt and seen.append(b.n_tokens), decode(c, b)))
        monkeypatch.setattr(
            MtpDrafter, "restart", lambda d, pos, h=True, row=0: (seen.append(("restart", h)), restart(d, pos, h, row))
        )
        assert [ev.token for ev in rt.generate(prompt, cfg, policy=_Nap(2))] == ref
    i_off = seen.index("h False")
    i_on = seen.index("h True", i_off)
    assert seen[i_off + 1 : i_on] == [1] * 7  # steps 2..8: plain decodes without h rows
    assert seen[i_on + 1 : i_on + 3] == [1, ("restart", True)]  # step 9 computes h; step 10 wakes with it
    assert seen.count("h False") == 1 and isinstance(seen[i_on + 3], int) and seen[i_on + 3] > 1  # drafting again


def test_adaptive_decisions_useless_vs_perfect_head(models):
    for noise, expect_on in ((8.0, False), (0.0, True)):
        with Runtime.load(models(head_noise=noise)["full"], spec_type="mtp") as rt:
            ctl = AdaptiveController(8, costs=FLAT, measure=False)
            for p in ("hello world", "the cat", "one two three"):
                tokens(rt, rt.tokenize(p), greedy(n_predict=100, spec_type="mtp"), "adaptive", ctl)
            st = ctl.steps_at
            if expect_on:  # (each step emits up to 9 tokens here: few steps)
                assert ctl.best >= 2 and sum(st[1:]) > 0.6 * sum(st)
                assert rt.stats.acceptance > 0.9 and rt.stats.tokens_per_pass > 3
            else:
                assert ctl.best == 0 and st[0] > 0.9 * sum(st)


def test_adaptive_with_measured_costs_runs_and_keeps_one_controller(models):
    with Runtime.load(models(head_noise=8.0)["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello")
        cfg = greedy(spec_type="mtp")
        auto = AutoDraft(rt)
        ref = tokens(rt, prompt, greedy())
        assert tokens(rt, prompt, cfg, "adaptive", auto=auto) == ref
        first = tokens.last.policy
        assert (
            tokens(rt, prompt, cfg, "adaptive", auto=auto) == ref and tokens.last.policy is first
        )  # learning carries over
        assert first.n_max == rt.stats.n_max == 8


def test_auto_without_and_with_a_profile(models, config_dir):
    s = models(head_noise=1.0)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello")
        cfg = greedy(spec_type="mtp")
        auto = AutoDraft(rt)
        ref = tokens(rt, prompt, greedy())
        assert tokens(rt, prompt, cfg, "auto", auto=auto) == ref
        assert tokens.last.note == NO_PROFILE_NOTE and tokens.last.policy is not None  # no profile: adaptive
        key = auto.profile_key(cfg)
        profiles.save(_profile(key, "mtp", 2, 0.0))
        assert tokens(rt, prompt, cfg, "auto", auto=auto) == ref
        assert rt.stats.spec_type == "mtp" and rt.stats.n_max == 2 and tokens.last.policy is None
        assert "tuned profile: mtp N=2" in tokens.last.note
        profiles.save(_profile(key, "none"))
        assert tokens(rt, prompt, cfg, "auto", auto=auto) == ref
        assert rt.stats.spec_type == "none" and rt.stats.n_drafted == 0
        # another thread count is another machine setting: no profile
        tokens(rt, prompt, greedy(spec_type="mtp", n_threads=2, n_predict=4), "auto", auto=auto)
        assert tokens.last.note == NO_PROFILE_NOTE


def test_cli_generate_auto_and_adaptive(models):
    path = str(models(head_noise=1.0)["full"])
    r = run_cli(
        "generate", "-m", path, "-p", "hello", "-n", "12", "--temp", "0", "-t", "1", "--spec-draft-n-max", "auto"
    )
    assert r.exit_code == 0, r.output
    assert "no tuned profile" in r.stderr and "adaptive: now N=" in r.stderr
    r = run_cli(
        "generate",
        "-m",
        path,
        "-p",
        "hello",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "1",
        "--spec-draft-n-max",
        "adaptive",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["stats"]["spec_type"] == "lookup,mtp" and "steps_at" in doc["adaptive"]  # (the default chain)


def test_a_draft_n_min_above_the_chosen_n_is_one_clear_error(models):
    from mtp_cli.errors import ConfigError

    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        with pytest.raises(ConfigError, match=r"draft_n_min 9 is above the draft length adaptive chose \(8\)"):
            AutoDraft(rt).resolve(greedy(spec_type="mtp", draft_n_min=9, draft_mode="adaptive"))


def test_plain_decoding_does_not_drive_a_policy(models):
    """A policy handed to spec type none learns nothing from plain steps (none drafts)."""
    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        ctl = AdaptiveController(4, costs=FLAT[:5], measure=False, start=3)
        out = [ev.token for ev in rt.generate(rt.tokenize("hello"), greedy(n_predict=24), policy=ctl)]
        assert len(out) == 24 and rt.stats.n_drafted == 0
        assert sum(ctl.steps_at) == 0 and ctl.cost(3) == FLAT[3]


def test_a_draft_length_mode_must_be_resolved_first(models):
    from mtp_cli.config import GenConfig
    from mtp_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="must be a number.*mtp_cli.speed.auto"):
        GenConfig(draft_n_max="auto").validated()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="draft_mode must be one of fixed, auto, adaptive"):
        GenConfig(draft_mode="sometimes").validated()
    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        for mode in ("auto", "adaptive"):  # (without the policy AutoDraft.resolve gives)
            with pytest.raises(ConfigError, match=f"draft_mode {mode} is chosen by mtp_cli.speed.auto"):
                rt.generate(rt.tokenize("hello"), greedy(spec_type="mtp", draft_mode=mode))


@pytest.mark.parametrize("told", [True, False])
def test_a_lookups_steps_beside_the_head_are_not_the_heads_to_measure(monkeypatch, told):
    """In a chain the lookup drafts some steps itself (long verify passes that give many tokens):
    those steps are reported as foreign and left out of the controller's windows. A head that loses
    (every draft step 2.3x a plain one, acceptance 0.5) stays off; counted as plain steps, the
    lookup's dear steps would make plain decoding look dear and the head look worth it."""
    clock = [0.0]
    monkeypatch.setattr("mtp_cli.speed.adaptive._now", lambda: clock[0])
    rng = random.Random(5)
    ctl = AdaptiveController(8)
    ctl.can_sleep = True
    k = a = -1
    ctl.begin(0.0)
    for done in range(6000):
        n = ctl.step(k, a, 0.0, done)
        if ctl.shadow:
            clock[0] += 0.02 * 2.3
            ctl.shadow_result(rng.random() < 0.5)
            k = a = 0
            continue
        if rng.random() < 0.3:  # the lookup's step: a long verify pass, reported to nobody but foreign()
            t = 0.02 * 4.0
            clock[0] += t
            if told:
                ctl.foreign(t)
            k = a = 0
            continue
        clock[0] += 0.02 * (2.3 + 0.3 * n) if n else 0.02
        k, a = n, 0
        while a < k and rng.random() < 0.5:
            a += 1
    ctl.end(6000)
    on = sum(ctl.steps_at[1:]) / sum(ctl.steps_at)
    if told:
        assert ctl.best == 0 and on < 0.05, (on, ctl.steps_at)
    else:
        assert on > 0.1, (on, ctl.steps_at)  # (what the test guards against: a head on, losing)


def test_no_drafts_keeps_the_drafter_asleep_without_h_rows(models, monkeypatch):
    """A request's draft length 0 (policy.NoDrafts): plain decoding's tokens, nothing drafted, and
    after the first step the target computes no h rows for a drafter that never wakes."""
    from mtp_cli.policy import NoDrafts

    on: list[bool] = []
    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        prompt, cfg, ref = _warm(rt, 3, 24)
        _spy_h_rows(rt, monkeypatch, on.append)
        gen = rt.generate(prompt, cfg, policy=NoDrafts(3))
        assert [ev.token for ev in gen] == ref and gen.stats.n_drafted == 0
    assert on and not any(on[1:])  # (the prompt's pass may still carry them; no step after)
