"""Training data (mtp_cli.train.data, collect, answers, selfprompts): the store's split and resume,
batched answers equal lone ones, sampled answers, the built-in and self-written prompts.
"""

from __future__ import annotations

import numpy as np
import pytest

from gguf_tools.gguf_file import open_gguf


def test_store_split_and_resume(trained):
    from mtp_cli.train.collect import collect
    from mtp_cli.train.data import Store

    job = trained["job"]
    work = job.work_dir
    st = Store.open(work / "data")
    assert st.split("train") and st.split("heldout")
    assert {s["kind"] for s in st.seqs} == {"text", "prompt"}
    n = st.n_rows
    seq = st.sequence(st.split("train")[0])
    assert seq["h"].shape == (len(seq["tokens"]), 64) and seq["topk_id"].shape[1] == 8
    assert np.all(np.diff(seq["topk_lp"].astype(np.float32), axis=1) <= 1e-3)  # best first
    from mtp_cli.train.pipeline import sources

    docs, prompts = sources(job)
    again = collect(work / "adopted.gguf", work / "data", texts=docs, prompts=prompts, cfg=job.collect)
    assert again.n_rows == n  # everything was done: nothing collected twice


def test_repeated_prompts_are_answered_once_and_stops_drop_only_unfinished(trained, tmp_path):
    from mtp_cli.train.collect import collect
    from mtp_cli.train.data import CollectConfig, Store

    adopted = trained["job"].work_dir / "adopted.gguf"
    prompts = ["the cat", "hello world", "the cat", "a world"]
    cfg = CollectConfig(max_len=48, max_new=24, n_threads=2, n_seq=2)
    calls = []
    st = collect(
        adopted, tmp_path / "d", prompts=prompts, cfg=cfg, should_stop=lambda: calls.append(1) or len(calls) > 3
    )
    first = {s["key"] for s in st.seqs}
    assert len(first) == len(st.seqs) < 3  # stopped early: only whole answers were stored
    st = collect(adopted, tmp_path / "d", prompts=prompts, cfg=cfg)
    assert len(st.seqs) == 3 and len({s["key"] for s in st.seqs}) == 3 and first <= {s["key"] for s in st.seqs}
    again = Store.open(tmp_path / "d")
    assert again.n_rows == st.n_rows == sum(s["len"] for s in again.seqs)  # the index was flushed


def test_batched_answers_equal_one_at_a_time(trained):
    """n_seq prompts answered in one context give the rows a lone greedy run + a teacher-forced pass give."""
    from mtp_cli.config import GenConfig
    from mtp_cli.runtime import Runtime
    from mtp_cli.train.answers import BatchedAnswerer
    from mtp_cli.train.collect import TrunkTeacher

    rt = Runtime.load(trained["job"].work_dir / "adopted.gguf", spec_type="none")
    prompts = [[1, *np.random.default_rng(i).integers(3, 300, 3 + 2 * i).tolist()] for i in range(5)]
    got: dict[str, dict] = {}
    ans = BatchedAnswerer(rt.model, max_len=40, top_k=8, n_seq=3, n_threads=1)
    teacher = TrunkTeacher(rt.model, max_len=40, top_k=8, n_threads=1)
    try:
        ans.run([(str(i), p, 24) for i, p in enumerate(prompts)], lambda k, seq: got.__setitem__(k, seq))
        assert sorted(got) == [str(i) for i in range(5)] and ans.n_gen > 0
        for i, p in enumerate(prompts):
            seq = got[str(i)]
            cfg = GenConfig(n_ctx=64, n_threads=1, temp=0.0, spec_type="none", n_predict=24)
            alone = [ev.token for ev in rt.generate(p, cfg)]
            assert seq["tokens"].tolist() == p + alone and seq["n_prompt"] == len(p)
            h, ids, lps = teacher.run(seq["tokens"].tolist())
            assert np.array_equal(ids[:, 0], seq["topk_id"][:, 0])
            assert np.abs(h - seq["h"].astype(np.float32)).max() < 1e-2 * max(1.0, float(np.abs(h).max()))
    finally:
        ans.close()
        teacher.close()
        rt.close()


def test_sampled_answers_follow_the_top_k_and_repeat_for_a_seed(trained):
    """temp > 0: each next token is one of the previous row's top-k, the run differs from greedy, and
    the same seed and key give the same sequence."""
    from mtp_cli.runtime import Runtime
    from mtp_cli.train.answers import BatchedAnswerer

    rt = Runtime.load(trained["job"].work_dir / "adopted.gguf", spec_type="none")
    p = [1, 5, 17, 42]

    def answer(temp: float, seed: int) -> dict:
        got: dict[str, dict] = {}
        a = BatchedAnswerer(rt.model, max_len=40, top_k=8, n_seq=2, n_threads=1, temp=temp, seed=seed)
        try:
            a.run([("k", p, 30)], lambda k, seq: got.__setitem__(k, seq))
        finally:
            a.close()
        return got["k"]

    try:
        greedy, s1, s1b, s2 = answer(0.0, 0), answer(5.0, 1), answer(5.0, 1), answer(5.0, 2)
        toks, ids = s1["tokens"], s1["topk_id"]
        assert len(toks) > len(p) + 5
        assert all(toks[j + 1] in ids[j] for j in range(len(p) - 1, len(toks) - 1))
        assert toks.tolist() == s1b["tokens"].tolist()
        assert toks.tolist() != greedy["tokens"].tolist() and toks.tolist() != s2["tokens"].tolist()
        assert np.array_equal(greedy["tokens"][len(p) :], greedy["topk_id"][len(p) - 1 : -1, 0])
    finally:
        rt.close()


def test_builtin_prompts_alternate_self_written_and_templated():
    from mtp_cli.prompts import read_prompts
    from mtp_cli.train.data import BUILTIN_PROMPTS, SELF_PROMPTS, builtin_prompts

    a, b, both = read_prompts(SELF_PROMPTS), read_prompts(BUILTIN_PROMPTS), builtin_prompts()
    assert len(a) >= 1000 and both[:4] == [a[0], b[0], a[1], b[1]]
    assert sorted(both) == sorted(a + b)


def test_self_prompts_are_clean_and_never_an_eval_prompt():
    """The shipped self-written prompts: one line each, within the filter, distinct, and none of the
    held-out evaluation prompts (case and spacing aside)."""
    from mtp_cli.prompts import read_prompts
    from mtp_cli.train.data import PROMPTS_DIR, SELF_PROMPTS
    from mtp_cli.train.selfprompts import SelfPromptConfig, acceptable
    from mtp_cli.train.selfprompts import normalized as norm

    ps = read_prompts(SELF_PROMPTS)
    cfg = SelfPromptConfig(n=0)
    assert all(acceptable(p, cfg) for p in ps)
    assert len({norm(p) for p in ps}) == len(ps)
    assert not {norm(p) for p in ps} & {norm(p) for p in read_prompts(PROMPTS_DIR / "eval_prompts.txt")}


def test_acceptable_filter():
    from mtp_cli.train.selfprompts import SelfPromptConfig, acceptable

    cfg = SelfPromptConfig(n=0)
    assert acceptable("How do I descale a kettle?", cfg)
    for bad in ("Hi", "two\nlines here now", "ends <|im_end|> here", "naïve café ümlaut ßß çç ñ", "w " * 61):
        assert not acceptable(bad, cfg), bad


@pytest.mark.slow
def test_self_prompts_from_smollm2(tmp_path):
    """The real model writes distinct, acceptable prompts after its template's user prefix; the same
    seed gives the same prompts; excluded ones never come out."""
    from mtp_cli.demo import source_model
    from mtp_cli.train.selfprompts import SelfPromptConfig, acceptable, generate_prompts, user_prefix

    model = source_model()
    pre = user_prefix(open_gguf(model), "<|im_start|>", "<|im_end|>")
    assert pre.endswith("<|im_start|>user\n")
    cfg = SelfPromptConfig(n=6, seed=3, n_seq=4)
    a = generate_prompts(model, cfg)
    assert len(a) == 6 and len(set(a)) == 6 and all(acceptable(p, cfg) for p in a)
    assert generate_prompts(model, cfg) == a
    b = generate_prompts(model, cfg, exclude=[a[0].upper()])
    assert a[0] not in b and b[:5] == a[1:]


def test_collect_reports_at_once_and_counts_only_this_runs_sources(trained, tmp_path):
    """The bar was full from the start: a resumed run counted what earlier runs stored as its own."""
    from mtp_cli.train.collect import collect
    from mtp_cli.train.data import CollectConfig

    adopted = trained["job"].work_dir / "adopted.gguf"
    cfg = CollectConfig(max_len=48, max_new=16, n_seq=2)
    seen = []
    collect(adopted, tmp_path / "d", prompts=["the cat", "a dog", "the cat"], cfg=cfg, progress=seen.append)
    assert seen[0].rows == 0 and seen[0].done == 0 and seen[0].total == 2  # before any answer; repeats once
    assert seen[-1].fraction == 1.0 and seen[-1].before == 0
    seen.clear()
    collect(
        adopted, tmp_path / "d", prompts=["the cat", "a dog", "new one", "and another"], cfg=cfg, progress=seen.append
    )
    assert (seen[0].before, seen[0].done, seen[0].total, seen[0].fraction) == (2, 2, 4, 0.0)
    assert seen[-1].fraction == 1.0


def test_collect_stops_at_its_deadline_and_reports_its_budget(trained, tmp_path):
    import time

    from mtp_cli.train.collect import collect
    from mtp_cli.train.data import CollectConfig

    adopted = trained["job"].work_dir / "adopted.gguf"
    seen = []
    st = collect(
        adopted,
        tmp_path / "d",
        prompts=[f"prompt {i}" for i in range(6)],
        cfg=CollectConfig(max_len=48, max_new=16, n_seq=2),
        progress=seen.append,
        deadline=time.monotonic() - 1,
    )
    assert st.n_rows == 0 and seen and seen[0].budget_s < 0


def test_answers_under_penalties_are_penalized_decodings_with_the_trunks_own_top_k(trained):
    """An answer written under a repeat penalty is what plain decoding with that flag writes, its stored
    top-k the trunk's unedited ones (the head drafts from those before the same edits steer its pick);
    collection spreads its prompts over the settings given, by key."""
    from mtp_cli.config import GenConfig
    from mtp_cli.runtime import Runtime
    from mtp_cli.sampling import RowEdits
    from mtp_cli.train.answers import BatchedAnswerer
    from mtp_cli.train.collect import TrunkTeacher, _Collection
    from mtp_cli.train.data import CollectConfig

    rt = Runtime.load(trained["job"].work_dir / "adopted.gguf", spec_type="none")
    prompts = [[1, *np.random.default_rng(i).integers(3, 300, 4 + i).tolist()] for i in range(4)]
    pen = GenConfig(n_ctx=64, n_threads=1, temp=0.0, spec_type="none", n_predict=30, repeat_penalty=2.0)
    got: dict[str, dict] = {}
    ans = BatchedAnswerer(rt.model, max_len=44, top_k=8, n_seq=3, n_threads=1, edits_for=lambda key: RowEdits(pen, ()))
    teacher = TrunkTeacher(rt.model, max_len=44, top_k=8, n_threads=1)
    try:
        ans.run([(str(i), p, 30) for i, p in enumerate(prompts)], lambda k, seq: got.__setitem__(k, seq))
        differs = 0
        for i, p in enumerate(prompts):
            seq = got[str(i)]
            alone = [ev.token for ev in rt.generate(p, pen)]
            plain = [ev.token for ev in rt.generate(p, GenConfig(**{**pen.__dict__, "repeat_penalty": 1.0}))]
            assert seq["tokens"].tolist() == p + alone
            differs += alone != plain
            _, ids, _ = teacher.run(seq["tokens"].tolist())
            assert np.array_equal(ids[:, 0], seq["topk_id"][:, 0])  # (the raw top-1, not the penalized pick)
        assert differs  # (the penalty changed some answer: the test sees it)
    finally:
        ans.close()
        teacher.close()
        rt.close()
    col = _Collection.__new__(_Collection)
    col.cfg = CollectConfig(penalties=((1.0, 0.0, 0.0), (1.1, 0.0, 0.0), (1.0, 0.5, 0.5)))
    chosen = [col.edits_for(f"prompt:{i}") for i in range(60)]
    assert sum(e is None for e in chosen) in range(10, 31)  # (the neutral setting: plain greedy)
    assert {(round(float(e.penalty), 3), float(e.freq)) for e in chosen if e is not None} == {(1.1, 0.0), (1.0, 0.5)}
    col.cfg = CollectConfig()
    assert col.edits_for("prompt:0") is None


def test_a_store_keeps_the_penalties_its_answers_were_written_under(tmp_path):
    """Found by review: prompts already answered are skipped by key, so a store written under other
    penalties (or none) would have been extended silently under mixed settings: refused in one line."""
    from mtp_cli.errors import TrainDataError
    from mtp_cli.train.data import Store

    dims = {"n_embd": 8, "top_k": 2, "n_vocab": 10, "model": "m"}
    Store.create(tmp_path / "d", **dims, penalties=((1.1, 0.0, 0.0),)).flush()
    Store.create(tmp_path / "d", **dims, penalties=((1.1, 0.0, 0.0),))  # (the same: resumed)
    for other in ((), ((1.0, 0.5, 0.5),)):
        with pytest.raises(TrainDataError, match="answer-penalty"):
            Store.create(tmp_path / "d", **dims, penalties=other)
