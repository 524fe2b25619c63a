"""A head asleep through the prompt re-reads its last rows on waking (mtp_cli.drafters.recall)."""

from __future__ import annotations

import numpy as np
import pytest

from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.drafters.recall import RECALL_ROWS, Recall
from mtp_cli.policy import DraftPolicy
from mtp_cli.runtime import Runtime
from tests.speedkit import greedy, tokens


@pytest.fixture(scope="session")
def models(tiny_models):
    return lambda **kw: tiny_models("glm4moe", "structured", "q8_0", **kw)


def _rows(n: int, pos0: int, e: int = 3) -> tuple[list[int], np.ndarray]:
    return list(range(pos0, pos0 + n)), np.arange(pos0 * e, (pos0 + n) * e, dtype=np.float32).reshape(n, e)


def test_recall_keeps_the_last_rows_of_a_contiguous_prompt():
    r = Recall(3, n_rows=5)
    r.add(*_rows(4, 0), 0)
    r.add(*_rows(3, 4), 4)  # (the next chunk)
    toks, h = r.below(100)
    assert toks.tolist() == [2, 3, 4, 5, 6] and h[:, 0].tolist() == [6, 9, 12, 15, 18] and r.end == 7
    assert r.below(3)[0].tolist() == [4, 5, 6]  # (no more than fit below the position woken at)
    r.cut(6)  # (a prompt rewound to 6: the row at 6 goes)
    assert r.below(100)[0].tolist() == [2, 3, 4, 5] and r.end == 6
    r.add(*_rows(2, 6), 6)
    assert r.below(100)[0].tolist() == [3, 4, 5, 6, 7]
    r.add(*_rows(2, 20), 20)  # (not where the last ended: another text)
    assert r.below(100)[0].tolist() == [20, 21] and r.end == 22
    r.cut(0)
    assert len(r.below(100)[0]) == 0 and r.end == 0


class _Wakes(DraftPolicy):
    """Asleep from before the prompt (an off controller's state), drafting from step 6."""

    sleep = True

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.sleep = done < 6
        return 0 if self.sleep else self.n_max


@pytest.mark.parametrize("spec", ["mtp", "lookup,mtp"])
def test_a_head_asleep_through_the_prompt_rereads_its_rows_on_waking(models, monkeypatch, spec):
    """Woken, the head's memory starts with the prompt's rows just below the position it wakes at:
    each token with the target's h row of the position before it, as an awake head would have decoded
    them (the target computed them for the prompt although the head slept). Plain decoding's tokens."""
    kept: list[np.ndarray] = []
    woke: list[tuple] = []
    remember, restart = MtpDrafter.remember, MtpDrafter.restart

    def spy_remember(d, toks, pos0):
        pairs = remember(d, toks, pos0)
        kept.append(np.array(pairs))
        return pairs

    def spy_restart(d, pos, h=True, row=0):  # (what it queues; a full batch is decoded as it fills)
        enqueue, got = d.rows.enqueue, []
        d.rows.enqueue = lambda t, p0, hh=None, spare=0: (
            got.append((list(t), p0, np.array(hh))),
            enqueue(t, p0, hh, spare),
        )
        try:
            restart(d, pos, h, row)
        finally:
            del d.rows.enqueue
        woke.append((pos, *got[0]) if len(got) == 1 else (pos, [], -1, None))

    with Runtime.load(models(head_noise=1.0)["full"], spec_type=spec) as rt:
        prompt = rt.tokenize("one two three four five six seven eight nine ten " * 8)
        assert RECALL_ROWS < len(prompt) < 400  # (chunks of n_batch 64, the last RECALL_ROWS rows recalled)
        cfg = greedy(spec_type=spec, draft_n_max=2, n_predict=24)
        ref = tokens(rt, prompt, greedy(n_predict=24))
        monkeypatch.setattr(MtpDrafter, "remember", spy_remember)
        list(rt.generate(prompt, cfg))  # awake: the rows it decodes
        awake = np.concatenate(kept)
        kept.clear()
        monkeypatch.setattr(MtpDrafter, "restart", spy_restart)
        assert [ev.token for ev in rt.generate(prompt, cfg, policy=_Wakes(2))] == ref
    assert len(kept) > 2 and np.array_equal(np.concatenate(kept), awake)  # (asleep, the same rows, kept)
    ((pos, toks, pos0, h),) = woke
    k = RECALL_ROWS
    assert pos > len(prompt) and toks == list(prompt[-k:]) and pos0 == pos - k
    assert np.array_equal(h, awake[-k:]) and np.abs(h).sum() > 0


def test_a_request_that_never_drafts_keeps_nothing(models, monkeypatch):
    """NoDrafts (a request's draft length 0) never wakes the head: the prompt's rows are not kept."""
    from mtp_cli.policy import NoDrafts

    calls: list[int] = []
    remember = MtpDrafter.remember
    monkeypatch.setattr(MtpDrafter, "remember", lambda d, t, p: (calls.append(p), remember(d, t, p))[1])
    with Runtime.load(models(head_noise=1.0)["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize("hello world")
        cfg = greedy(spec_type="mtp", draft_n_max=2, n_predict=8)
        list(rt.generate(prompt, cfg, policy=NoDrafts(2)))
        assert calls == []
        list(rt.generate(prompt, cfg))
        assert calls == [0]  # (awake, on_prefill keeps them too)
