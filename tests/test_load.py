"""Drafting by load (mtp_cli.load): beside other sequences a sequence drafts only what pays for the rows
it adds to the shared decode, by this machine's measured costs and its own acceptance; alone its own
policy decides. The rule (drafts_beside), the record it reads, the gate's steps, several gates
together, and the runner: what it counts of the others' steps, what it measures, and drafting beside
another sequence exactly."""

from __future__ import annotations

import pytest

from mtp_cli.load import (
    LOAD_EVIDENCE,
    LOAD_PROBE_GAP,
    LOAD_PROBE_GAP_MAX,
    LOAD_PROBE_STEPS,
    LOAD_WARM,
    LOAD_WINDOW,
    DraftRecord,
    LoadGate,
    drafts_beside,
)
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
    "rows, tokens, drafted, v, h, drafts",
    [
        (1, 1, 0, gpu, 0.1, True),  # alone where rows are cheap: the head pays
        (4, 4, 0, gpu, 0.1, True),  # beside 3 others, still
        (64, 64, 0, gpu, 0.1, False),  # a big batch: its rows give more than the drafts would
        (1, 1, 0, cpu, 0.25, False),  # 2 cores: not even alone
        (4, 4, 0, cpu, 0.25, False),
        (4, 4, 0, gpu, 1.5, False),  # a head as dear as the target
        (2, 2, 0, lambda k: 1.0 + k if k < 2 else 1.8 + 0.2 * k, 0.17, False),  # a fit's slope below the mean row's
        (13, 13, 9, gpu, 0.02, False),  # beside 3 others drafting 3, all kept: no room
        (13, 7, 9, gpu, 0.02, True),  # the same rows giving 7 tokens: rejected drafts give none
    ],
)
def test_drafts_beside_weighs_the_drafts_against_the_rows_they_add(rows, tokens, drafted, v, h, drafts):
    k = drafts_beside(rows, tokens, ACC, v, h, drafted=drafted)
    assert (k > 0) is drafts
    if drafts:  # (the best k: each further draft's chance against its row)
        row = max(v(rows) - v(rows - 1), (v(rows - 1) - 1) / (rows - 1) if rows > 1 else 0)
        now = v(rows - 1) + drafted * h
        rate = lambda n: (tokens + sum(ACC[:n])) / (now + n * (row + h))  # noqa: E731
        assert rate(k) == max(rate(n) for n in (1, 2, 3))


def test_the_margin_holds_to_start_and_not_to_go_on():
    v = lambda k: 1.0 + 0.3 * k  # noqa: E731
    assert drafts_beside(2, 2, ACC[:1], v, 0.1) == 0  # (pays 5%: not enough to start)
    assert drafts_beside(2, 2, ACC[:1], v, 0.1, margin=1.0) == 1


def test_fewer_drafts_than_n_min_are_not_drafted():
    v = lambda k: 1.0 + 0.3 * k  # noqa: E731
    acc = [0.8, 0.1, 0.05]  # (one draft pays, two do not)
    assert drafts_beside(1, 1, acc, v, 0.1) == 1 and drafts_beside(1, 1, acc, v, 0.1, n_min=2) == 0
    g, _ = gate(gpu, [(3, 3, 0)], known=False, head_s=None)
    g.n_min = 2
    g.record.unknown = LOAD_PROBE_GAP
    ns = [g.step(0, 0, 0.0, i) for i in range(LOAD_WARM + 1)]
    assert ns == [0] * LOAD_WARM + [2]  # (after its warm-up, a probe drafts what the loop keeps)


def test_the_record_knows_acceptance_only_on_evidence():
    r = DraftRecord()
    r.seen(0, 0)  # (a step that drafted nothing says nothing)
    assert r.acceptance(3) is None
    evidence(r, 2, 1)
    assert r.drafted[0] == pytest.approx(LOAD_EVIDENCE, abs=1.0)
    acc = r.acceptance(4)
    assert acc[0] == pytest.approx(1.0) and acc[1] == pytest.approx(0.0)
    assert acc[2] == acc[3] == pytest.approx(0.0)  # (past what was seen: geometric, never rising)
    thin = DraftRecord()
    while thin.acceptance(1) is None:  # (half of the first drafts kept)
        thin.seen(1, 1)
        thin.seen(1, 0)
    thin.seen(3, 3)  # (one deep step is no evidence for positions 2 and 3: continued from position 1)
    acc = thin.acceptance(3)
    assert acc[0] == pytest.approx(0.5, abs=0.05) and acc[1] == pytest.approx(acc[0] ** 2)


def test_the_record_times_the_drafter_per_token_drafted_but_a_generations_first_drafting_step():
    r = DraftRecord()
    r.begin()
    r.clocked(0.0, -1)  # (the first step: nothing drafted yet)
    r.clocked(0.5, 3)  # the first drafting step (the prompt's catch-up in it): not timed
    assert r.head_s is None
    r.clocked(0.53, 3)  # 3 drafts in 30 ms
    r.clocked(0.53, 0)  # (a step that drafted nothing)
    assert r.head_s == pytest.approx(0.01)
    r.begin()  # a new generation: its drafter's seconds restart
    r.clocked(0.0, 0)
    r.clocked(0.2, 1)
    r.clocked(0.22, 1)
    assert r.head_s == pytest.approx(0.01 + 0.1 * (0.02 - 0.01))


class Inner(DraftPolicy):
    def __init__(self):
        super().__init__(3)
        self.sleep = True
        self.calls, self.foreign_steps, self.told = 0, 0, []

    def step(self, drafted, accepted, t_consumer, done):
        self.calls += 1
        self.told.append((drafted, accepted))
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
    """others: a one-item list holding (rows, tokens, drafts) of the others' last step."""
    rec = DraftRecord()
    if known:
        evidence(rec, 3, 3)
    rec.head_s = head_s
    inner = Inner()
    return LoadGate(inner, lambda: others[0], measured(v), rec, lambda: 0.0), inner


def test_beside_others_the_gate_decides_and_an_asleep_head_first_catches_up():
    others = [(3, 3, 0)]
    g, inner = gate(gpu, others)
    ns = [g.step(-1, -1, 0.0, 0)]
    assert g.hold and not g.sleep and ns == [0]  # (the lookup holds; the head wakes to catch up)
    ns += [g.step(0, 0, 0.0, i) for i in range(1, LOAD_WARM + 2)]
    assert ns[:LOAD_WARM] == [0] * LOAD_WARM and ns[LOAD_WARM] == 3
    assert inner.calls == 0 and inner.foreign_steps == LOAD_WARM + 1  # (its steps are the inner's foreign ones)
    others[0] = (0, 0, 0)  # alone: the inner policy decides, told nothing of the gate's last step
    assert g.step(3, 3, 0.0, 20) == 3 and inner.calls == 1 and not g.hold
    assert inner.told == [(0, 0)] and inner.foreign_steps == LOAD_WARM + 2
    g.step(3, 2, 0.0, 21)
    assert inner.told[-1] == (3, 2)  # (its own step: reported)
    others[0] = (3, 3, 0)
    g.step(3, 3, 0.0, 22)
    g.end(23)  # (a generation ending on a step decided here: that one is foreign too)
    assert inner.foreign_steps == LOAD_WARM + 3


def test_a_held_step_the_loop_also_leaves_untimed_is_one_foreign_step():
    """A step decided beside others that the loop also tells as foreign (one of the first after the
    prompt, or after a lookup's pass: policy.StepClock) reaches the inner policy once."""
    others = [(3, 3, 0)]
    g, inner = gate(gpu, others)
    g.step(-1, -1, 0.0, 0)  # (held: the others share the decode)
    g.foreign(0.004)  # (the loop's clock: step 0 untimed, told before the next step's call)
    g.step(0, 0, 0.0, 1)
    assert inner.foreign_steps == 1
    g.foreign(0.004)
    g.end(2)
    assert inner.foreign_steps == 2


@pytest.mark.parametrize("why", ["cpu costs", "no evidence", "costs unknown"])
def test_beside_others_the_gate_holds_where_drafts_cannot_pay_or_it_does_not_know(why):
    others = [(3, 3, 0)]
    g, inner = gate(cpu if why == "cpu costs" else gpu, others, known=why != "no evidence")
    if why == "costs unknown":
        g.costs = StepCosts()
    ns = [g.step(0, 0, 0.0, i) for i in range(2 * LOAD_WINDOW)]
    assert ns == [0] * len(ns) and g.hold and g.sleep and g.quiet  # (held: no h rows either)
    assert inner.calls == 0


def test_a_decision_holds_for_a_window():
    others = [(3, 3, 0)]
    g, _ = gate(gpu, others)
    g.sleep = False  # (an awake head drafts at once)
    assert g.step(0, 0, 0.0, 0) == 3
    g.costs = measured(lambda k: 1.0 + k)  # (costs turn dear: seen at the next decision, not before)
    ns = [g.step(3, 3, 0.0, i) for i in range(1, LOAD_WINDOW + 1)]
    assert ns == [3] * (LOAD_WINDOW - 1) + [0]


@pytest.mark.parametrize("v, drafts", [(cpu, False), (gpu, True)])
def test_started_beside_others_a_head_that_would_not_pay_follows_none_of_the_prompt(v, drafts):
    g, inner = gate(v, [(3, 3, 0)])
    inner.sleep = g.sleep = False  # (its controller is drafting)
    g.start()
    assert g.sleep is not drafts
    if drafts:  # (awake through the prompt, whatever its controller said: it drafts at once)
        assert g.step(-1, -1, 0.0, 0) == 3
        g2, _ = gate(v, [(3, 3, 0)])
        g2.start()
        assert not g2.sleep and g2.step(-1, -1, 0.0, 0) == 3


@pytest.mark.parametrize("v, probes", [(gpu, True), (cpu, False)])
def test_a_slot_never_alone_probes_where_drafts_could_pay(v, probes):
    """No evidence (the slot was never alone) and its head never timed: after LOAD_PROBE_GAP steps
    beside others, single drafts for a while if perfect drafts of a free head would pay (not on the
    AMD EPYC's costs); once they are in, the rule decides on them."""
    others, clock = [(3, 3, 0)], [0.0]
    g, inner = gate(v, others, known=False, head_s=None)
    g.clock = lambda: clock[0]
    ns: list[int] = []
    k = 0
    for i in range(LOAD_PROBE_GAP + LOAD_WINDOW + LOAD_WARM + 3 * LOAD_PROBE_STEPS):
        k = g.step(k, k, 0.0, i)  # (every draft kept)
        clock[0] += 0.001 * k
        ns.append(k)
    assert ns[:LOAD_PROBE_GAP] == [0] * LOAD_PROBE_GAP and inner.calls == 0
    if not probes:
        assert not any(ns)
        return
    first = ns.index(1)
    # (single drafts until its evidence is in: LOAD_EVIDENCE first drafts, decayed)
    assert first <= LOAD_PROBE_GAP + LOAD_WINDOW + LOAD_WARM and set(ns[first : first + int(LOAD_EVIDENCE)]) == {1}
    assert g.record.acceptance(3) == pytest.approx([1.0, 1.0, 1.0]) and g.record.head_s == pytest.approx(0.001)
    assert ns[-1] == 3  # (what it learned: all kept, a tenth of a decode each)


def test_a_probe_that_learns_nothing_ends_and_the_next_waits_twice_as_long():
    """Its drafts never reported (discarded below n_min, a generation ending first): the probe ends
    after LOAD_PROBE_STEPS steps all the same, and each such probe doubles the wait for the next."""
    g, _ = gate(gpu, [(3, 3, 0)], known=False, head_s=None)
    ns = [
        g.step(0, 0, 0.0, i)
        for i in range(LOAD_PROBE_GAP + 2 * LOAD_PROBE_GAP + 2 * LOAD_PROBE_STEPS + 4 * LOAD_WINDOW)
    ]
    drafting = [i for i, k in enumerate(ns) if k]
    assert drafting and len(drafting) <= 2 * (LOAD_PROBE_STEPS + LOAD_WINDOW)  # (two probes, each bounded)
    first, second = drafting[0], next(i for i in drafting if i > drafting[0] + LOAD_PROBE_STEPS + LOAD_WINDOW)
    assert second - first >= 2 * LOAD_PROBE_GAP and g.record.gap == min(4 * LOAD_PROBE_GAP, LOAD_PROBE_GAP_MAX)


def test_on_two_cores_a_slot_probes_once_then_holds():
    """CPU costs at 2 rows, where perfect drafts could pay: one probe, whose drafts (6 in 10 kept, a
    head at 0.15 of a decode) say they do not; then no drafts, and no probe again."""
    clock = [0.0]
    g, _ = gate(cpu, [(1, 1, 0)], known=False, head_s=None)
    g.clock = lambda: clock[0]
    ns, k = [], 0
    for i in range(6 * LOAD_PROBE_GAP):
        k = g.step(k, k * (i % 10 < 6), 0.0, i)
        clock[0] += 0.0015 * k
        ns.append(k)
    assert 0 < sum(1 for k in ns if k) <= LOAD_PROBE_STEPS + LOAD_WINDOW and not any(ns[-4 * LOAD_PROBE_GAP :])


def test_short_generations_finish_a_probe_across_them():
    """Generations of 6 steps beside others, each under a gate of its own on the slot's one record:
    the probe goes on from one to the next (its head following each prompt: no warm-up), the evidence
    comes in, and then the rule decides."""
    rec, clock = DraftRecord(), [0.0]
    costs = measured(gpu)
    ns: list[int] = []
    for _ in range(LOAD_PROBE_GAP // 6 + 20):
        g = LoadGate(Inner(), lambda: (3, 3, 0), costs, rec, lambda: clock[0])
        g.start()
        g.begin(0.0)
        clock[0], k = 0.0, -1
        for i in range(6):
            k = g.step(k, k, 0.0, i)
            clock[0] += 0.001 * max(k, 0)
            ns.append(k)
        g.end(6)
    assert rec.acceptance(3) is not None and rec.head_s == pytest.approx(0.001)
    assert ns[-1] == 3 and sum(1 for k in ns[: LOAD_PROBE_GAP + LOAD_PROBE_STEPS + LOAD_WINDOW] if k) > 0


def test_several_gates_draft_together_steadily_where_rows_are_cheap():
    """Four slots beside each other on GPU-like costs, each head's draft a tenth of a decode: once all
    draft, each step also takes the others' head decodes, so going on pays (left out, every slot
    saw its drafts pay less than the batch's mean and stopped every other window, a warm-up each
    time)."""
    gates = [gate(gpu, [(0, 0, 0)])[0] for _ in range(4)]
    last = [(1, 1)] * 4  # (rows, tokens) of each slot's last step (every draft kept)
    clocks = [0.0] * 4  # each head's seconds: 1 ms a draft, a tenth of the target's 10 ms decode
    for i, g in enumerate(gates):
        g.others = lambda i=i: tuple(sum(x) for x in zip(*[(r, t, r - 1) for j, (r, t) in enumerate(last) if j != i]))
        g.clock = lambda i=i: clocks[i]
    ns = []
    for step in range(6 * LOAD_WINDOW):
        n = [g.step(last[i][0] - 1, last[i][0] - 1, 0.0, step) for i, g in enumerate(gates)]
        last = [(1 + k, 1 + k) for k in n]
        clocks = [c + 0.001 * k for c, k in zip(clocks, n)]
        ns.append(n)
    assert gates[0].record.head_s == pytest.approx(0.001)
    assert all(k > 0 for n in ns[LOAD_WARM + 1 :] for k in n)


def test_the_runner_counts_the_others_steps_and_measures_every_shared_decode(tiny_models):
    """_others: the other sequences' rows and tokens in the last step (drafts as the tokens they
    gave, a prompt chunk or a sequence that joined since as one and one), then alone those of the
    last shared step for 16 steps; StepCosts gets every decode but one holding a prompt chunk."""
    from dataclasses import replace

    from mtp_cli.runtime import Runtime
    from mtp_cli.slots import LOAD_AFTER, BatchRunner
    from tests.parity import SENSITIVE, greedy

    s = tiny_models("glm4moe", head_noise=1.0, **SENSITIVE)
    with Runtime.load(s["full"], spec_type="mtp", n_parallel=2) as rt:
        cfg = greedy(spec_type="mtp", draft_n_max=3, n_ctx=512, n_batch=4, n_predict=200, ignore_eos=True)
        runner = BatchRunner(rt)
        prep = rt.prepare(rt.tokenize("the cat sat on the mat"), cfg, seq=0)
        costs, seen = prep.ctxs.costs, []
        real = costs.observe
        costs.observe = lambda k, t: seen.append(k) or real(k, t)  # type: ignore[method-assign]
        assert runner._others(1) == (0, 0, 0)  # (nothing runs)
        runner.add(prep)
        assert runner._others(1) == (1, 1, 0) and runner._others(0) == (0, 0, 0)  # (joined, not stepped yet)
        while runner.running[0].loop.prefilling:
            runner.step()
            assert runner._others(1) == (1, 1, 0) and not seen  # (a prompt chunk: one and one, not measured)
        runner.step()
        drafted, rows = len(runner.running[0].loop._drafts), runner._last[0][0]
        kept = runner.running[0].loop.a
        assert rows == 1 + drafted and runner._others(1) == (rows, 1 + kept, drafted) and seen == [drafted]
        runner.add(rt.prepare(rt.tokenize("hello world"), replace(cfg, n_predict=12), seq=1))
        steps = 0
        while 1 in runner.running:
            runner.step()
            steps += 1
        shared = runner._shared
        assert steps > 2
        theirs = (*shared[1], shared[1][0] - 1)
        assert len(shared) == 2 and runner._others(0) == theirs
        for _ in range(LOAD_AFTER - (runner._steps - runner._shared_at)):
            assert runner._others(0) == theirs and 0 in runner.running
            runner.step()
        runner.step()
        assert runner._others(0) == (0, 0, 0) and 0 in runner.running
        runner.close()


def test_the_runner_measures_every_shared_decode_and_drafts_beside_another_exactly(tiny_models, monkeypatch):
    """A gated sequence beside a forced one: the runner's decodes of 2+ rows are measured (the costs
    become known), and where the rule says drafts pay the gated sequence drafts beside the other
    (its head only: the lookup of its chain is held), its output plain decoding's."""
    from mtp_cli import load
    from mtp_cli.runtime import Runtime
    from mtp_cli.slots import BatchRunner
    from tests.parity import SENSITIVE, greedy

    monkeypatch.setattr(load, "drafts_beside", lambda *a: 2)
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
        asked = []  # what the lookup was asked for while the other sequence ran (alone, its policy decides)
        real = lookup.draft
        monkeypatch.setattr(
            lookup, "draft", lambda i, p, n: (len(runner.running) == 2 and asked.append(n)) or real(i, p, n)
        )
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
        assert shared > 0 and other.n_drafted > 0 and asked and not any(asked)
        assert rec.head_s != 1e-4  # (its drafting steps were timed)


def test_a_gated_request_that_never_drafts_keeps_no_prompt_rows():
    """The gate says what its policy says of waking (DraftPolicy.wakes): a request's draft length of
    0 (NoDrafts) keeps none of its prompt's rows for a head that will not wake (drafters.recall)."""
    from mtp_cli.policy import NoDrafts

    g = LoadGate(NoDrafts(2), lambda: (0, 0, 0), measured(gpu), DraftRecord(), lambda: 0.0)
    assert not g.wakes and g.sleep
    g, _ = gate(gpu, [(0, 0, 0)])
    assert g.wakes
