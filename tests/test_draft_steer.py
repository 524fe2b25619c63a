"""Drafts see what the target sees (sampling.DraftSteer): a drafter picks each draft token from its row
as the target's verified row at the same position will be edited (logit biases, --ignore-eos, the
penalties over the history and the drafts before it), with --spec-draft-p-min reading the edited row.
Measured by acceptance, not only output: a drafter that ignores an edit loses drafts it would keep.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtp_cli.config import GenConfig
from mtp_cli.loop import VerifyLoop
from mtp_cli.runtime import Runtime
from mtp_cli.sampling import ConfidenceProbe, DraftSteer, RowEdits
from tests.factory import TinySpec, token_permutation
from tests.parity import PROMPT, THREADS, run
from tests.test_drafters import write_tiny_mimo2

N_GEN = 40


def _cfg(**kw) -> GenConfig:
    base = dict(n_predict=N_GEN, n_ctx=512, n_batch=64, n_threads=THREADS, temp=0.0)
    return GenConfig(**{**base, **kw})


def test_draft_picks_are_the_argmax_of_the_rows_the_target_will_verify():
    rng = np.random.default_rng(7)
    V = 60
    history = rng.integers(0, V, 50).tolist()
    rows = rng.normal(0, 2, (5, V)).astype(np.float32)
    rows[:, history[-1]] += 8.0  # each raw argmax is a token in the window: the penalty moves it
    cfg = GenConfig(
        repeat_penalty=1.8, repeat_last_n=24, frequency_penalty=0.4, presence_penalty=0.3, logit_bias=((3, -np.inf),)
    )
    edits = RowEdits(cfg, ())
    steer = DraftSteer(edits, history)
    probe = ConfidenceProbe(V)
    picks = [steer.pick(rows[i].copy(), 0.0, probe) for i in range(5)]
    assert None not in picks
    verified = rows.copy()
    edits.apply(verified, history, picks)  # (row i: after history + picks[:i], as a verify batch's)
    assert picks == [int(r.argmax()) for r in verified]
    assert picks != [int(r.argmax()) for r in rows] and 3 not in picks


def test_p_min_reads_the_row_as_edited():
    """A row sure of a banned token: its edited row is not sure of anything (no draft at p_min 0.5);
    a plain steer drafts the banned token, which the target could never keep."""
    row = np.full(10, 0.0, dtype=np.float32)
    row[4] = 6.0  # p = 0.98 before the ban, the rest uniform after it
    probe = ConfidenceProbe(10)
    banned = RowEdits(GenConfig(logit_bias=((4, -np.inf),)), ())
    assert DraftSteer(banned).pick(row.copy(), 0.5, probe) is None
    assert DraftSteer(banned).pick(row.copy(), 0.0, probe) != 4
    assert DraftSteer().pick(row.copy(), 0.5, probe) == 4


def _unsteered(self, k_max, limit):
    """The mutant: the drafter picks from unedited rows (the grammar still guides it)."""
    d, g = self.drafter, self.chooser.grammar
    copy = g.copy() if g is not None else None
    if d.rows is not None:
        d.rows.steer = DraftSteer(None, (), copy)
    try:
        return self._draft(k_max, limit)
    finally:
        if d.rows is not None:
            d.rows.steer = d.rows.plain
        if copy is not None:
            copy.close()


def _window_prompt(rt: Runtime) -> tuple[list[int], list[int]]:
    """The prompt, then every other token of the structured model's whole cycle (wherever generation
    goes, its next plain choice is in the penalties' window about half the time), and those tokens."""
    p0 = rt.tokenize(PROMPT)
    half = run(rt, p0, _cfg(n_predict=rt.n_vocab - 4))[::2]
    return p0 + half + p0[1:], half


EDITS = {
    "repeat": dict(repeat_penalty=6.0, repeat_last_n=256),
    "freq-presence": dict(frequency_penalty=40.0, presence_penalty=20.0, repeat_last_n=256),
}


def _drafters(tmp: Path, tiny_models) -> dict[str, tuple[Path, dict]]:
    """Every kind of drafter that picks from logits: an own-KV head (glm4moe, and qwen35's recurrent
    target), chained heads (mimo2), a draft model (the trunk itself: it agrees with the target)."""
    glm = tiny_models("glm4moe", head_noise=0.0)
    return {
        "glm4moe": (glm["full"], dict(spec_type="mtp")),
        "qwen35": (tiny_models("qwen35", head_noise=0.0)["full"], dict(spec_type="mtp")),
        "mimo2": (write_tiny_mimo2(tmp / "mimo2.gguf", n_heads=3, mix=0.02, head_noise=0.0), dict(spec_type="mtp")),
        "draft": (glm["trunk"], dict(spec_type="draft", draft_model=str(glm["trunk"]))),
    }


@pytest.mark.parametrize("kind", ["glm4moe", "qwen35", "mimo2", "draft"])
def test_every_drafter_picks_under_the_targets_edits(tmp_path, tiny_models, kind, monkeypatch):
    """Heads that agree with the target (no noise) keep agreeing under penalties and a banned set:
    every draft is kept and the output is plain decoding's with the same flags; the same drafter
    picking from unedited rows loses most of its drafts."""
    path, spec = _drafters(tmp_path, tiny_models)[kind]
    with Runtime.load(path, **spec) as rt:
        prompt, half = _window_prompt(rt)
        plain = run(rt, prompt, _cfg())
        ban = tuple((t, -np.inf) for t in half)  # (as the penalties' window: half the plain choices)
        for name, edits in [*EDITS.items(), ("ban", dict(logit_bias=ban))]:
            ref = run(rt, prompt, _cfg(**edits))
            assert ref != plain, name  # (the edit changes this text)
            cfg = _cfg(draft_n_max=3, spec_type=spec["spec_type"], **edits)
            assert run(rt, prompt, cfg) == ref, name
            steered = rt.stats.acceptance
            with monkeypatch.context() as mp:
                mp.setattr(VerifyLoop, "_steered", _unsteered)
                assert run(rt, prompt, cfg) == ref, name
                unsteered = rt.stats.acceptance
            assert steered > 0.95 and unsteered < steered - 0.3, (name, steered, unsteered)


def test_ignore_eos_drafts_past_the_end(tiny_models, monkeypatch):
    """--ignore-eos: where the target would end, the head drafts what the target then chooses."""
    arch = "glm4moe"
    perm = token_permutation(TinySpec(arch=arch))
    with Runtime.load(tiny_models(arch)["trunk"]) as rt:
        trig = rt.tokenize(PROMPT)[-1]
    for _ in range(5):
        trig = int(perm[trig])  # EOS follows the 5th generated token
    s = tiny_models(arch, head_noise=0.0, eos_after=trig)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        cfg = _cfg(spec_type="mtp", draft_n_max=3, n_predict=30, ignore_eos=True)
        ref = run(rt, prompt, _cfg(n_predict=30, ignore_eos=True))
        assert run(rt, prompt, cfg) == ref and rt.stats.acceptance == 1.0
        monkeypatch.setattr(VerifyLoop, "_steered", _unsteered)
        assert run(rt, prompt, cfg) == ref and rt.stats.acceptance < 1.0


def test_sampling_under_penalties_stays_exact_and_drafts_are_kept(tiny_models, monkeypatch):
    """Sampled, same seed: drafting under the penalties emits plain sampling's tokens, and keeps more
    drafts than a drafter picking from unedited rows."""
    s = tiny_models("glm4moe", head_noise=0.0)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = _window_prompt(rt)[0]
        acc: dict[str, list[float]] = {"steered": [], "unsteered": []}
        mismatches = 0
        for seed in range(6):
            base = _cfg(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed, **EDITS["repeat"])
            plain = run(rt, prompt, base)
            for which in acc:
                with monkeypatch.context() as mp:
                    if which == "unsteered":
                        mp.setattr(VerifyLoop, "_steered", _unsteered)
                    out = run(rt, prompt, GenConfig(**{**base.__dict__, "spec_type": "mtp", "draft_n_max": 3}))
                mismatches += out != plain
                acc[which].append(rt.stats.acceptance)
        assert mismatches <= 1  # (one draw per token, as plain sampling's; a near-tie may flip once)
        assert np.mean(acc["steered"]) > np.mean(acc["unsteered"]) + 0.1, acc


def test_a_steer_edits_only_the_window_and_the_biased_tokens():
    """The per-token cost stays small: a draft row's edit writes the biased tokens and those in the
    window, nothing else of the vocabulary."""
    V = 1000
    row = np.arange(V, dtype=np.float32)
    before = row.copy()
    cfg = GenConfig(repeat_penalty=1.3, repeat_last_n=4, logit_bias=((900, -1.0),))
    DraftSteer(RowEdits(cfg, ()), [10, 11, 12, 13, 14]).pick(row, 0.0, ConfidenceProbe(V))
    assert set(np.flatnonzero(row != before)) == {11, 12, 13, 14, 900}


def test_a_draft_row_shorter_than_the_targets_vocabulary_skips_the_ids_past_its_end():
    """A draft model may have a few tokens fewer than the target (drafters.base allows 128): biases,
    EOG bans and window tokens past its row's end cannot be drafted, so they are skipped, not an
    IndexError on every drafting step."""
    cfg = GenConfig(repeat_penalty=1.3, repeat_last_n=8, logit_bias=((2, -5.0), (105, 3.0)), ignore_eos=True)
    edits = RowEdits(cfg, eog_tokens=(103,))
    row = np.arange(100, dtype=np.float32)
    steer = DraftSteer(edits, [7, 101, 99])
    assert steer.pick(row, 0.0, ConfidenceProbe(100)) == 98  # (99 penalized, 2 biased; 101, 103, 105 skipped)
    assert (
        row[2] == -3.0 and row[7] == np.float32(7.0) / np.float32(1.3) and row[99] == np.float32(99.0) / np.float32(1.3)
    )
