"""Text lookup (drafters.lookup) and what verification costs here (step_costs): the draft length
follows the match and its track record against the measured costs, nothing is drafted where nothing
matches or where drafting would not pay, and output stays plain decoding's."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_cli.config import GenConfig
from mtp_cli.drafters.lookup import MATCH_CAP, LookupDrafter
from mtp_cli.runtime import Runtime
from mtp_cli.step_costs import PRIOR_FIRST, PRIOR_SLOPE, StepCosts
from tests.factory import TinySpec, token_permutation
from tests.parity import greedy, run

pytestmark = pytest.mark.measured_costs  # (this module's costs are its own: built and observed here)


def flat(v: float = 1.05) -> StepCosts:
    """A GPU-like machine: every verify pass costs about a plain step."""
    c = StepCosts()
    for k in range(0, 33):
        c.observe(k, 0.010 * (v if k else 1.0))
    return c


def moderate() -> StepCosts:
    """This CPU with AMX, 2 threads: v(1) about 1.2, then 0.2 a token."""
    c = StepCosts()
    for k in range(0, 33):
        c.observe(k, 0.010 * (1.0 + 0.2 * k))
    return c


def steep() -> StepCosts:
    """A small CPU: each drafted token costs most of a plain step."""
    c = StepCosts()
    for k in range(0, 33):
        c.observe(k, 0.010 * (1.0 + 0.6 * k))
    return c


def test_costs_are_measured_and_fitted_by_a_line():
    c = StepCosts()
    assert c.v(0) == 1.0 and c.v(4) == pytest.approx(PRIOR_FIRST + 4 * PRIOR_SLOPE)  # nothing measured
    for _ in range(16):  # a machine whose passes cost 1 + 0.2 k, measured at three lengths
        for k in (0, 2, 6):
            c.observe(k, 0.010 * (1.0 + 0.2 * k))
    for k in (2, 4, 6, 10, 20):  # measured, between, past: the line through them (the prior weighs little)
        assert c.v(k) == pytest.approx(1.0 + 0.2 * k, rel=0.06)
    assert c.measured()[2] == pytest.approx(1.4)
    c.observe(3, 0.0)  # (a zero time is no measurement)
    assert 3 not in c.measured()


def test_a_few_dear_passes_of_one_length_do_not_make_longer_ones_dear():
    """A length never drafted is never measured again: one noisy pass must not price every length
    past it out (each k's own mean, extrapolated from the last two, did: the lookup then drafted 4
    tokens at most for a whole run of copies)."""
    c = StepCosts()
    for _ in range(16):
        c.observe(0, 0.010)
        c.observe(4, 0.025)
    c.observe(5, 0.035)  # one dear pass
    assert c.v(8) < 3.5 and c.v(16) < 5.5
    vs = [c.v(k) for k in range(1, 33)]
    assert vs == sorted(vs)  # longer never cheaper
    falling = StepCosts()
    for k in range(8):
        falling.observe(k, 0.010 * (2.0 - 0.1 * k) if k else 0.010)
    assert [falling.v(k) for k in range(1, 9)] == sorted(falling.v(k) for k in range(1, 9))


def test_a_plain_step_after_a_verify_pass_charges_its_rebuild_to_the_pass():
    """llama.cpp keeps one graph: the plain step after a pass of another shape builds its own again,
    and that is what drafting cost, not what plain decoding costs."""
    c = StepCosts()
    for _ in range(16):
        c.observe(0, 0.010)
    for _ in range(60):
        c.observe(4, 0.020)
        c.observe(0, 0.013)
    assert c.measured()[0] == pytest.approx(1.0) and c.measured()[4] == pytest.approx(2.3, rel=0.02)
    before = c.measured()[4]
    c.unobserved()  # (a prompt was decoded in between: the next plain step follows it)
    c.observe(0, 0.013)
    assert c.measured()[4] < before  # (plain decoding's own mean took it, not the pass's)


def test_a_cold_first_pass_of_a_length_is_not_its_cost():
    """A new batch shape's first pass may build (on a GPU, capture) its graph: one far dearer than
    expected is dropped, so that length is drafted, and measured, again; the next is its cost."""
    c = StepCosts()
    c.observe(0, 0.010)
    c.observe(4, 0.020)
    c.observe(8, 0.200)  # (cold: 20 plain steps for what should cost about 3)
    assert c.v(8) < 4.0 and 8 not in c.measured()
    before = c.v(8)
    c.observe(8, 0.150)  # (dear again: it is)
    assert c.measured()[8] == pytest.approx(15.0) and c.v(8) > before + 1.0


def _drafter(costs: StepCosts, text: list[int]) -> LookupDrafter:
    d = LookupDrafter(costs)
    d.begin(text[:-1])
    return d


def test_a_long_verbatim_run_drafts_long_where_verification_is_cheap():
    run_ = list(range(100, 160))  # 60 tokens said once, then again from the start
    text = [1, 2, 3, *run_, 7, 8, *run_[:40]]
    d = _drafter(flat(), text)
    out = d.draft(text[-1], len(text) - 1, 32)
    assert d.match()[0] >= 40 and out == run_[40:60] + [7, 8] + run_[:10]  # what followed, 32 tokens
    d2 = _drafter(steep(), text)
    short = d2.draft(text[-1], len(text) - 1, 32)
    assert 0 < len(short) < len(out) and short == out[: len(short)]  # the same copy, as long as it pays


def test_a_copy_ends_before_an_end_of_generation_token():
    """Nothing after an end-of-generation token is ever generated, and the target gives that token
    as its own: a copy stops before it (a quoted block's end in the prompt is followed by the
    template's end of turn)."""
    run_ = list(range(100, 120))
    text = [1, *run_, 2, 50, 51, 9, *run_[:10]]
    plain = _drafter(flat(), text).draft(text[-1], len(text) - 1, 16)
    assert plain[:11] == [*run_[10:], 2]  # (without a stop set: through it)
    d = LookupDrafter(flat(), stop=[2])
    d.begin(text[:-1])
    assert d.draft(text[-1], len(text) - 1, 16) == run_[10:]
    d.begin([1, 5, 6, 2, 3, 5])
    assert d.draft(6, 6, 8) == []  # (a copy that would start with one: nothing)


def test_no_match_no_draft_and_a_short_match_drafts_less_than_a_long_one():
    d = _drafter(flat(), list(range(10, 60)))  # nothing repeats
    assert d.draft(59, 50, 32) == [] and d.match() == (0, -1)
    costs = steep()
    short = _drafter(costs, [5, 6, 9, 9, 9, 1, 2, 3, 4, 5, 6])  # "5 6" once before: L = 2
    long_ = _drafter(costs, [*range(20, 40), 3, 3, *range(20, 38)])  # L = 18
    assert len(short.draft(6, 10, 16)) < len(long_.draft(37, 39, 16))


def test_the_track_record_stops_drafting_from_matches_that_fail():
    costs = moderate()
    text = [4, 5, 6, 7, 1, 4, 5]  # "4 5" -> 6 7 ...
    d = _drafter(costs, text)
    b = d.record(2, 0)  # (a copy of the prompt)
    p0 = d.odds(2, 0)[0]
    assert d.draft(5, 6, 8)  # the prior (Laplace: 3/4 after 2 agreeing tokens) drafts
    for _ in range(12):  # every such draft fails at once
        d._bucket, d._proposed = b, [6]
        d.accept(0, [6])
    assert d.odds(2, 0)[0] < p0 / 2
    d.begin(text[:-1])
    assert d.draft(5, 6, 8) == []  # a plain step promises more now
    assert min(d.odds(MATCH_CAP, 0)) > 0.9  # (other buckets keep their own record)


def test_copies_from_the_output_keep_a_record_apart_from_the_prompts():
    """In edit work the prompt holds the text copied; the model's own phrasing coming round again is
    another matter: copies of the output failing says nothing about copies of the prompt."""
    d = LookupDrafter(moderate())

    def output_copy() -> list[int]:
        d.begin([4, 5, 6, 7, 1])
        for t in (8, 9, 3, 8):
            assert d.draft(t, 0, 0) == []  # (the output so far, nothing asked)
        return d.draft(9, 9, 8)

    out = output_copy()
    assert out[:3] == [3, 8, 9] and d.match() == (2, 7)  # (a copy of the output's own "8 9 3")
    assert d.record(2, 7) != d.record(2, 2) and d.odds(2, 7) == d.odds(2, 2)  # (apart, the same prior)
    for _ in range(12):  # every such copy fails at once
        d._bucket, d._proposed = d.record(2, 7), out
        d.accept(0, out)
    assert d.odds(2, 7)[0] < d.odds(2, 2)[0] / 2
    assert output_copy() == []
    d.begin([4, 5, 6, 7, 1, 4])
    assert d.draft(5, 6, 8)[:2] == [6, 7] and d.match()[1] == 2  # the prompt's copies still drafted


def test_a_copy_that_starts_right_is_expected_to_go_on():
    """First tokens that fail half the time, later ones that hold: the record keeps them apart, and
    the drafts grow longer than one rate for both would make them."""
    d = LookupDrafter(moderate())
    d.begin([1] * 8)
    b = d.record(4, 0)  # (a copy of the prompt)
    for i in range(40):
        d._bucket, d._proposed = b, [1] * 6
        d.accept(0 if i % 2 else 6, [1] * 6)  # half fail at once, half are kept whole
    p, alpha = d.odds(4, 0)
    assert 0.4 < p < 0.6 and alpha > 0.9
    one_rate = d.length(0.75, 0.75, 16)  # (about the geometric rate of the same record)
    assert d.length(p, alpha, 16) > one_rate


def test_lookup_output_is_plain_decodings_and_it_drafts_where_the_text_repeats(tiny_models, monkeypatch):
    """On the structured model's cycle: the continuation repeats the prompt's stretch of it, so the
    lookup drafts it long (verification cheap, as on a GPU) and it is kept; greedy output equals
    plain decoding, sampled too."""
    monkeypatch.setattr(StepCosts, "v", lambda self, k: 1.0 + 0.02 * k)
    s = tiny_models("glm4moe")
    perm = token_permutation(TinySpec(arch="glm4moe"))
    x = int(np.nonzero(perm >= 0)[0][10])
    cyc = [x]
    for _ in range(40):
        cyc.append(int(perm[cyc[-1]]))
    prompt = [1, *cyc, 200, 201, *cyc[:2]]
    with Runtime.load(s["trunk"]) as rt:
        ref = run(rt, prompt, greedy(n_predict=40))
        out = run(rt, prompt, greedy(spec_type="lookup", draft_n_max=32, n_predict=40))
        assert out == ref and rt.stats.n_accepted > 10 and max(rt.stats.drafted_at[4:] or [0]) > 0
        sampled = GenConfig(n_predict=30, n_ctx=256, n_threads=1, temp=0.9, seed=5)
        assert run(rt, prompt, GenConfig(**{**sampled.__dict__, "spec_type": "lookup", "draft_n_max": 16})) == run(
            rt, prompt, sampled
        )


def test_only_its_own_verified_drafts_go_into_its_record():
    """Drafts it proposed but the loop discarded (--spec-draft-n-min), or another member's in a
    chain, say nothing about its matches."""
    d = _drafter(moderate(), [4, 5, 6, 7, 1, 4, 5])
    before = d.odds(2, 0)
    assert d.draft(5, 6, 8)
    d.accept(0, [9, 9])  # (the head's drafts, verified in its place)
    d.accept(0, [])  # (its own, discarded)
    assert d.odds(2, 0) == before
