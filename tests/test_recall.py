"""A head asleep through the prompt re-reads its last rows on waking (mtp_cli.drafters.recall)."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.drafters.recall import RECALL_ROWS, Recall
from mtp_cli.policy import DraftPolicy
from mtp_cli.runtime import Runtime
from tests.speedkit import greedy, tokens


@pytest.fixture(scope="session")
def models(tiny_models):
    return lambda **kw: tiny_models("glm4moe", "structured", "q8_0", **kw)


def _raw(n: int, pos0: int, e: int = 3) -> tuple[list[int], np.ndarray]:
    """Tokens pos0.. and the target's h rows of the same positions (row p's values 3p..3p+2)."""
    return list(range(pos0, pos0 + n)), np.arange(pos0 * e, (pos0 + n) * e, dtype=np.float32).reshape(n, e)


def test_recall_pairs_each_token_with_the_h_row_before_it():
    r = Recall(3, n_rows=5)
    r.add(*_raw(4, 0), 0)
    r.add(*_raw(3, 4), 4)  # (the next chunk: its first token pairs with the last chunk's last h)
    toks, h = r.below(100)
    assert toks.tolist() == [2, 3, 4, 5, 6] and h[:, 0].tolist() == [3, 6, 9, 12, 15] and r.end == 7
    assert r.below(3)[0].tolist() == [4, 5, 6]  # (no more than fit below the position woken at)
    r.cut(6)  # (a prompt rewound to 6: the row at 6 goes, and its pair is the next one's)
    assert r.below(100)[0].tolist() == [2, 3, 4, 5] and r.end == 6
    r.add(*_raw(2, 6), 6)
    toks, h = r.below(100)
    assert toks.tolist() == [3, 4, 5, 6, 7] and h[:, 0].tolist() == [6, 9, 12, 15, 18]
    r.add(*_raw(2, 20), 20)  # (not where the last ended: another text, its first pair unknown)
    toks, h = r.below(100)
    assert toks.tolist() == [20, 21] and h[:, 0].tolist() == [0, 60] and r.end == 22
    r.add(*_raw(10, 0), 0)  # (a chunk longer than it keeps)
    toks, h = r.below(100)
    assert toks.tolist() == [5, 6, 7, 8, 9] and h[:, 0].tolist() == [12, 15, 18, 21, 24]
    r.cut(0)
    assert len(r.below(100)[0]) == 0 and r.end == 0


class _Wakes(DraftPolicy):
    """Asleep from before the prompt (an off controller's state), drafting from step `at`."""

    sleep = True

    def __init__(self, n_max: int, at: int):
        super().__init__(n_max)
        self.at = at

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.sleep = done < self.at
        return 0 if self.sleep else self.n_max


@pytest.mark.parametrize("spec, at", [("mtp", 6), ("mtp", 0), ("lookup,mtp", 6)])
def test_a_head_asleep_through_the_prompt_rereads_its_rows_on_waking(models, monkeypatch, spec, at):
    """Woken, the head's memory starts with the prompt's last RECALL_ROWS rows just below the position
    it wakes at, each token with the target's h row of the position before it, as an awake head
    would have had them; the target computed h rows only for the prompt chunks that reach them.
    Woken at the first step, its first draft row pairs with the prompt's last h row. Plain decoding's
    tokens."""
    added: list[tuple[int, np.ndarray]] = []
    woke: list[tuple] = []
    h_on: list[bool] = []  # (the target's h rows, per prompt decode)
    add, restart, decode, set_h = Recall.add, MtpDrafter.restart, lx.decode, lx.set_embeddings_nextn
    monkeypatch.setattr(Recall, "add", lambda r, t, h, p0: (added.append((p0, np.array(h))), add(r, t, h, p0)))

    def spy_restart(d, pos, h=True, row=0):  # (what it queues; a full batch is decoded as it fills)
        enqueue, got, before = d.rows.enqueue, [], d.pending_h.copy()
        d.rows.enqueue = lambda t, p0, hh=None, spare=0: (
            got.append((list(t), p0, np.array(hh))),
            enqueue(t, p0, hh, spare),
        )
        try:
            restart(d, pos, h, row)
        finally:
            del d.rows.enqueue
        woke.append((pos, got, before, d.pending_h.copy()))

    with Runtime.load(models(head_noise=1.0)["full"], spec_type=spec) as rt:
        prompt = rt.tokenize("one two three four five six seven eight nine ten " * 8)
        P, k = len(prompt), RECALL_ROWS
        assert k + 64 < P < 400  # (chunks of n_batch 64: the first reaches none of the last k rows)
        cfg = greedy(spec_type=spec, draft_n_max=2, n_predict=24)
        ref = tokens(rt, prompt, greedy(n_predict=24))
        list(rt.generate(prompt, cfg))  # awake: every chunk's h rows
        awake = np.concatenate([h for _, h in added])
        assert [p0 for p0, _ in added] == list(range(0, P, 64)) and len(awake) == P
        added.clear()
        tgt = rt._ctx.target  # type: ignore[union-attr]
        monkeypatch.setattr(
            lx, "set_embeddings_nextn", lambda c, on, m: (c is tgt and h_on.append(on), set_h(c, on, m))
        )
        monkeypatch.setattr(
            lx, "decode", lambda c, b: (c is tgt and b.n_tokens > 1 and h_on.append(b.n_tokens), decode(c, b))
        )
        monkeypatch.setattr(MtpDrafter, "restart", spy_restart)
        assert [ev.token for ev in rt.generate(prompt, cfg, policy=_Wakes(2, at))] == ref
    assert [p0 for p0, _ in added] == list(range(64, P, 64))  # (asleep: the chunks that reach the last k rows)
    assert np.array_equal(np.concatenate([h for _, h in added]), awake[64:])
    i = h_on.index(64)  # (the first chunk's decode: h rows off for it, on for the next)
    assert h_on[i - 1] is False and h_on[i + 1] is True and h_on[i + 2] == 64
    ((pos, got, before, after),) = woke
    ((toks, pos0, pairs),) = got
    assert pos == P + at if spec == "mtp" else pos >= P + at
    assert toks == list(prompt[-k:]) and pos0 == pos - k and np.array_equal(pairs, awake[P - k - 1 : P - 1])
    assert not before.any()  # (asleep, remembering moved no pending h row: a borrowing slot would take it)
    if at == 0:  # (the prompt's last h row: row len(chunk) - 1 of the last decode, not its first)
        assert np.array_equal(after, awake[P - 1])


def test_a_request_that_never_drafts_keeps_nothing(models, monkeypatch):
    """NoDrafts (a request's draft length 0) never wakes the head: the prompt's rows are not kept."""
    from mtp_cli.policy import NoDrafts

    calls: list[int] = []
    add = Recall.add
    monkeypatch.setattr(Recall, "add", lambda r, t, h, p0: (calls.append(p0), add(r, t, h, p0)))
    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world")
        cfg = greedy(spec_type="mtp", draft_n_max=2, n_predict=8)
        list(rt.generate(prompt, cfg, policy=NoDrafts(2)))
        assert calls == []
        list(rt.generate(prompt, cfg))
        assert calls == [0]  # (awake, on_prefill keeps them too)


def test_a_kept_prefix_keeps_its_rows_and_a_rewound_tail_loses_them(models, monkeypatch):
    """A second prompt that shares the first one's head (the memory reused, the rest rewound): the
    rows below the kept prefix stay recalled, the first prompt's tail past it does not come back."""
    woke: list[list[int]] = []
    restart = MtpDrafter.restart

    def spy_restart(d, pos, h=True, row=0):
        restart(d, pos, h, row)
        woke.append([int(t) for t in d.recall.below(pos)[0]])

    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        head = rt.tokenize("one two three four five six seven eight nine ten " * 4)
        first, second = head + rt.tokenize(" alpha beta gamma delta"), head + rt.tokenize(" omega psi chi phi")
        cfg = greedy(spec_type="mtp", draft_n_max=2, n_predict=8)
        list(rt.generate(first, cfg, policy=_Wakes(2, 100)))  # (asleep throughout: it remembers the prompt)
        monkeypatch.setattr(MtpDrafter, "restart", spy_restart)
        list(rt.generate(second, cfg, policy=_Wakes(2, 0), reuse=True))
    assert woke[-1] == list(second[-RECALL_ROWS:])
