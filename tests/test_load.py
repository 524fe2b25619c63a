"""Drafting by load (mtp_cli.load): beside other sequences a sequence drafts only what pays for the rows
it adds to the shared decode, by this machine's measured costs and its own acceptance; alone its own
policy decides. The rule (drafts_beside), the record it reads, the gate's steps, and the runner
measuring every shared decode and drafting beside another sequence exactly."""

from __future__ import annotations

import pytest

from mtp_cli.load import LOAD_EVIDENCE, LOAD_WARM, LOAD_WINDOW, DraftRecord, LoadGate, drafts_beside
from mtp_cli.policy import DraftPolicy
from mtp_cli.step_costs import StepCosts

pytestmark = pytest.mark.measured_costs  # (the runner's measuring is under test)

ACC = [0.8, 0.6, 0.45]


def evidence(rec: DraftRecord, k: int, a: int) -> None:
    """Steps of k drafts, a kept, until the record knows its acceptance."""
    while rec.acceptance(1) is None:
        rec.seen(k, a)


def cpu(k: int) -> float:
    return 1.0 + 0.55 * k  # (the AMD EPYC's demo rows: every row is compute)


def gpu(k: int) -> float:
    return 1.0 + 0.02 * k  # (a few rows more cost next to nothing)


@pytest.mark.parametrize(
    "rows, v, h, drafts",
    [
        (1, gpu, 0.1, True),  # alone where rows are cheap: the head pays
        (4, gpu, 0.1, True),  # beside 3 others, still
        (64, gpu, 0.1, False),  # a big batch: its rows give more than the drafts would
        (1, cpu, 0.25, False),  # 2 cores: not even alone
        (4, cpu, 0.25, False),
        (4, gpu, 1.5, False),  # a head as dear as the target
        (2, lambda k: 1.0 + k if k < 2 else 1.8 + 0.2 * k, 0.17, False),  # a fit's slope below the mean row's
    ],
)
def test_drafts_beside_weighs_the_drafts_against_the_rows_they_add(rows, v, h, drafts):
    k = drafts_beside(rows, ACC, v, h)
    assert (k > 0) is drafts
    if drafts:  # (the best k: each further draft's chance against its row)
        row = max(v(rows) - v(rows - 1), (v(rows - 1) - 1) / (rows - 1) if rows > 1 else 0)
        rate = lambda n: (rows + sum(ACC[:n])) / (v(rows - 1) + n * (row + h))  # noqa: E731
        assert rate(k) == max(rate(n) for n in (1, 2, 3))


def test_the_record_knows_acceptance_only_on_evidence_and_follows_the_drafters_clock():
    r = DraftRecord()
    r.seen(0, 0)  # (a step that drafted nothing says nothing)
    assert r.acceptance(3) is None
    evidence(r, 2, 1)
    assert r.drafted[0] == pytest.approx(LOAD_EVIDENCE, abs=1.0)
    acc = r.acceptance(4)
    assert acc[0] == pytest.approx(1.0) and acc[1] == pytest.approx(0.0)
    assert acc[2] == acc[3] == pytest.approx(0.0)  # (past what was seen: geometric, never rising)
    r.clocked(0.0, 0)
    r.clocked(0.03, 3)  # 3 decodes in 30 ms
    assert r.head_s == pytest.approx(0.01)
    r.clocked(0.0, 0)  # (a new generation restarts the drafter's totals)
    r.clocked(0.02, 1)
    assert r.head_s == pytest.approx(0.01 + 0.1 * (0.02 - 0.01))


class Inner(DraftPolicy):
    def __init__(self):
        super().__init__(3)
        self.sleep = True
        self.calls, self.foreign_steps = 0, 0

    def step(self, drafted, accepted, t_consumer, done):
        self.calls += 1
        return 3

    def foreign(self, seconds):
        self.foreign_steps += 1


def measured(v) -> StepCosts:
    c = StepCosts()
    for _ in range(8):
        for k in (0, 1, 3, 7, 15):
            c.observe(k, 0.01 * v(k))
    return c


def gate(v, others, known=True, head_s=0.001):
    rec = DraftRecord()
    if known:
        evidence(rec, 3, 3)
    rec.head_s = head_s
    inner = Inner()
    return LoadGate(inner, lambda: others[0], measured(v), rec, lambda: (0.0, 0)), inner


def test_beside_others_the_gate_decides_and_an_asleep_head_first_catches_up():
    others = [3]
    g, inner = gate(gpu, others)
    ns = [g.step(-1, -1, 0.0, 0)]
    assert g.hold and not g.sleep and ns == [0]  # (the lookup holds; the head wakes to catch up)
    ns += [g.step(0, 0, 0.0, i) for i in range(1, LOAD_WARM + 2)]
    assert ns[:LOAD_WARM] == [0] * LOAD_WARM and ns[LOAD_WARM] == 3
    assert inner.calls == 0 and inner.foreign_steps == LOAD_WARM + 1  # (its steps are the inner's foreign ones)
    others[0] = 0  # alone: the inner policy decides
    assert g.step(3, 3, 0.0, 20) == 3 and inner.calls == 1 and not g.hold


@pytest.mark.parametrize("why", ["cpu costs", "no evidence", "costs unknown"])
def test_beside_others_the_gate_holds_where_drafts_cannot_pay_or_it_does_not_know(why):
    others = [3]
    g, inner = gate(cpu if why == "cpu costs" else gpu, others, known=why != "no evidence")
    if why == "costs unknown":
        g.costs = StepCosts()
    ns = [g.step(0, 0, 0.0, i) for i in range(2 * LOAD_WINDOW)]
    assert ns == [0] * len(ns) and g.hold and g.sleep and g.quiet  # (held: no h rows either)
    assert inner.calls == 0


def test_a_decision_holds_for_a_window():
    others = [3]
    g, _ = gate(gpu, others)
    g.sleep = False  # (an awake head drafts at once)
    assert g.step(0, 0, 0.0, 0) == 3
    g.costs = measured(cpu)  # (costs turn dear: seen at the next decision, not before)
    ns = [g.step(3, 3, 0.0, i) for i in range(1, LOAD_WINDOW + 1)]
    assert ns == [3] * (LOAD_WINDOW - 1) + [0]


def test_the_runner_measures_every_shared_decode_and_drafts_beside_another_exactly(tiny_models, monkeypatch):
    """A gated sequence beside a forced one: the runner's decodes of 2+ rows are measured (the costs
    become known), and where the rule says drafts pay the gated sequence drafts beside the other
    (its head only: the lookup of its chain is held), its output plain decoding's."""
    from mtp_cli import load
    from mtp_cli.runtime import Runtime
    from mtp_cli.slots import BatchRunner
    from tests.parity import SENSITIVE, greedy

    monkeypatch.setattr(load, "drafts_beside", lambda rows, acc, v, h: 2)
    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    texts = ("hello world hello world hello world", "the cat sat on")
    with Runtime.load(s["full"], spec_type="lookup,mtp", n_parallel=2) as rt:
        cfg = greedy(spec_type="lookup,mtp", draft_n_max=3, n_ctx=512)
        plain = [[ev.token for ev in rt.generate(rt.tokenize(t), greedy(n_ctx=512))] for t in texts]
        runner = BatchRunner(rt)
        prep = rt.prepare(rt.tokenize(texts[0]), cfg, policy=Inner(), seq=0)
        rec = runner.records.setdefault((0, prep.drafter.name), DraftRecord())
        evidence(rec, 3, 2)
        rec.head_s = 1e-4
        lookup = next(m for m in prep.drafter.parts if m.self_sized)
        asked = []
        real = lookup.draft
        monkeypatch.setattr(lookup, "draft", lambda i, p, n: asked.append(n) or real(i, p, n))
        st = runner.add(prep, gate=True)
        other = runner.add(rt.prepare(rt.tokenize(texts[1]), cfg, seq=1))
        toks: dict[int, list[int]] = {0: [], 1: []}
        shared = 0  # drafts seq 0 verified while seq 1 ran
        while runner.running:
            both = len(runner.running) == 2
            for seq, o in runner.step().items():
                toks[seq] += [ev.token for ev in o.events]
            shared = st.n_drafted if both else shared
        assert [toks[0], toks[1]] == plain
        assert prep.ctxs.costs.known() and max(prep.ctxs.costs.measured()) >= 2
        assert shared > 0 and other.n_drafted > 0 and not any(asked)
