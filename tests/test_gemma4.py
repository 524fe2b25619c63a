"""Gemma 4's assistant drafter (gemma4-assistant: Q-only attention over the target's KV cache) with
tiny pairs (tests/gemma4_pair.py): a random one (every draft rejected), structured ones that agree
with the target always or for part of the vocabulary. inspect names both files; generate drafts
through the memory-shared path and keeps plain decoding's output (greedy, sampling's distribution,
EOS and -n inside a draft, a full context, rollback in the sliding-window cache); misuse is one line."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from gguf_tools.report import ASSISTANT, NO_MTP_GRAPH, inspect_file
from mtp_cli import llama_ext as lx
from mtp_cli.cli import main
from mtp_cli.config import GenConfig
from mtp_cli.drafters.mtp import SHARED_N_BATCH, MtpDrafter
from mtp_cli.errors import ModelFileError, VocabMismatchError
from mtp_cli.runtime import Runtime
from tests.factory import BOS_ID, EOS_ID
from tests.gemma4_pair import SWA, Gemma4Pair, write_gemma4_pair
from tests.parity import PROMPT, check_prefix_reuse, greedy, run
from tests.test_sampling import SAMPLING, SIG, _p_values, _sample_runs, biased_verify


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_gemma4_pair(tmp_path_factory.mktemp("gemma4"))


def test_inspect_says_what_each_file_is_and_how_to_use_them_together(pair):
    t, a = inspect_file(pair.target), inspect_file(pair.assistant)
    assert t.verdict == NO_MTP_GRAPH and "gemma4-assistant" in t.advice and "-md ASSISTANT.gguf" in t.advice
    assert a.verdict == ASSISTANT and f"-md {pair.assistant}" in a.advice


def test_the_assistant_drafts_through_the_targets_memory_and_keeps_plain_output(pair):
    with Runtime.load(pair.target, spec_type="mtp", draft_model=pair.assistant) as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy(n_predict=24))
        for n in (1, 2, 3, 4, 8):
            out = run(rt, prompt, greedy(n_predict=24, spec_type="mtp", draft_n_max=n))
            assert out == ref, n
            assert rt.stats.n_drafted > 0 and rt.stats.stop_reason == "n_predict"
        d = rt.contexts(GenConfig(spec_type="mtp", draft_n_max=8, n_ctx=256, n_batch=64, n_threads=1))[1]
        assert isinstance(d, MtpDrafter) and d.mem_shared  # (no KV of its own: ctx_other kept)
        assert lx.n_batch(d.ctx) == SHARED_N_BATCH  # one row a decode: a small compute buffer
        for sleep in (False, True):  # a kept prefix of the target's memory is the assistant's too
            check_prefix_reuse(rt, greedy(spec_type="mtp", draft_n_max=3, n_predict=10), sleep)


def test_an_agreeing_assistant_has_every_draft_accepted_and_the_same_output(tmp_path):
    both = write_gemma4_pair(tmp_path / "agree", agree=1.0)
    with Runtime.load(both.target, spec_type="mtp", draft_model=both.assistant) as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy(n_predict=25))
        assert len(ref) == 25
        for n in (1, 3, 6):
            assert run(rt, prompt, greedy(n_predict=25, spec_type="mtp", draft_n_max=n)) == ref, n
            st = rt.stats
            # every pass keeps its N drafts and adds its own token: 24 tokens after the first
            assert st.acceptance == 1.0 and st.n_verify == -(-24 // (n + 1)), (n, st.acceptance, st.n_verify)


def test_pack_refuses_the_pair_saying_how_it_is_used(pair, tiny_models, tmp_path):
    out = tmp_path / "o.gguf"
    r = CliRunner().invoke(
        main, ["pack", str(pair.target), "--heads", str(tiny_models("glm4moe")["sidecar"]), "-o", str(out)]
    )
    assert r.exit_code == 2 and "gemma4-assistant model, given as -md" in r.output, r.output
    r = CliRunner().invoke(
        main, ["pack", str(tiny_models("glm4moe")["trunk"]), "--heads", str(pair.assistant), "-o", str(out)]
    )
    assert r.exit_code == 2 and "drafter, not an MTP head" in r.output and "-md" in r.output, r.output
    assert not out.exists()


def test_misuse_is_one_line(pair, tmp_path):
    r = CliRunner().invoke(main, ["generate", "-m", str(pair.assistant), "-p", "hi", "-n", "2"])
    assert r.exit_code == 2 and "is a gemma4-assistant drafter: give it as -md" in r.output, r.output
    r = CliRunner().invoke(
        main, ["generate", "-m", str(pair.target), "-md", str(pair.target), "--spec-type", "mtp", "-p", "hi"]
    )
    assert r.exit_code == 2 and "has no MTP head" in r.output, r.output
    other = write_gemma4_pair(tmp_path, target_width=128).assistant  # an assistant for a wider target
    r = CliRunner().invoke(
        main, ["generate", "-m", str(pair.target), "-md", str(other), "--spec-type", "mtp", "-p", "hi", "-n", "2"]
    )
    assert r.exit_code == 2 and "128" in r.output and "64" in r.output and "Traceback" not in r.output, r.output


def test_bench_and_tune_take_the_assistant(pair, tmp_path):
    """tune's cost probe decoded the assistant at a position the target already held: llama.cpp
    refused the batch ("llama_decode failed with code -1")."""
    from gguf_tools.gguf_file import open_gguf
    from mtp_cli.config import LoadConfig
    from mtp_cli.speed import profiles
    from mtp_cli.speed.bench import bench
    from mtp_cli.speed.tune import tune

    b = bench(pair.target, LoadConfig(draft_model=str(pair.assistant)), n_predict=8, repeats=1, n_threads=1)
    rows = {r.name: r for r in b.rows}
    for name in ("none", "mtp N=1", "mtp N=2", "mtp N=3", "mtp N=4", "auto", "adaptive"):
        assert rows[name].result is not None, name
    assert rows["mtp N=3"].result.stats.n_drafted > 0
    t = tune(
        pair.target,
        LoadConfig(draft_model=str(pair.assistant)),
        budget=3,
        n_max=2,
        n_threads=1,
        save=True,
        config_dir=tmp_path,
    )
    assert t.cost is not None and len(t.cost.verify) == 3 and t.best is not None
    # the profile is the pair's: another assistant for the same target has none
    other = write_gemma4_pair(tmp_path / "other", seed=1).assistant
    key = lambda d: profiles.identify(open_gguf(pair.target), open_gguf(d), n_threads=1, flash_attn=False).key  # noqa: E731  (off: -fa auto on a CPU)
    assert profiles.find(key(pair.assistant), tmp_path) is not None
    assert profiles.find(key(other), tmp_path) is None


def _far_from_eos(p: Gemma4Pair, n: int) -> list[int]:
    """BOS and n tokens of the target's cycle, the last of them at least 100 steps before EOS."""
    e = p.order.index(EOS_ID)
    return [BOS_ID] + [p.order[(e + 1 + i) % len(p.order)] for i in range(n)]


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """Agrees on 70% of the tokens; the target's attention makes ~1/5 of its tokens context-dependent."""
    return write_gemma4_pair(tmp_path_factory.mktemp("partial"), agree=0.7, context_mix=8.0)


def test_a_partly_agreeing_assistant_drafts_from_its_own_state_and_keeps_plain_output(partial):
    """Accepted and rejected drafts in one run, at every N; draft positions past the first (drafted
    from the assistant's own token and post_projection state) are accepted too."""
    with Runtime.load(partial.target, spec_type="mtp", draft_model=partial.assistant) as rt:
        prompt = _far_from_eos(partial, 30)  # longer than the sliding window
        ref = run(rt, prompt, greedy(n_predict=80, n_batch=8))
        assert len(ref) == 80 and len(prompt) > SWA
        for n in range(1, 9):
            out = run(rt, prompt, greedy(n_predict=80, n_batch=8, spec_type="mtp", draft_n_max=n))
            st = rt.stats
            assert out == ref, n
            assert 0 < st.n_accepted < st.n_drafted, (n, st.n_accepted, st.n_drafted)
            if n >= 3:
                assert st.accepted_at[1] > 0 and st.accepted_at[2] > 0, (n, st.accepted_at)


def test_rollback_in_the_sliding_window_cache(pair):
    """The random assistant's drafts are all rejected: every verify pass rolls its N positions back
    out of the target's sliding-window and global caches, the prompt and output many windows long.
    (The caches are llama.cpp's default swa_full: n_ctx cells, so a window is a mask, no cell reused.)"""
    with Runtime.load(pair.target, spec_type="mtp", draft_model=pair.assistant) as rt:
        prompt = rt.tokenize(" ".join(["the cat sat on the mat"] * 6))
        assert len(prompt) > 2 * SWA
        ref = run(rt, prompt, greedy(n_predict=64, n_batch=8))
        for n in (1, 2, 5, 8):
            assert run(rt, prompt, greedy(n_predict=64, n_batch=8, spec_type="mtp", draft_n_max=n)) == ref, n
            assert rt.stats.n_drafted > 0 and rt.stats.n_accepted == 0


def test_eos_inside_an_accepted_draft(tmp_path):
    both = write_gemma4_pair(tmp_path, agree=1.0)
    e, n = both.order.index(EOS_ID), len(both.order)
    before = [both.order[(e - 8 + i) % n] for i in range(8)]  # EOS follows these
    prompt = [BOS_ID, before[0]]
    seen: list[tuple[int, list[int]]] = []
    orig = MtpDrafter.accept

    def spy(self, n_accepted, drafts):
        seen.append((n_accepted, list(drafts)))
        return orig(self, n_accepted, drafts)

    with (
        Runtime.load(both.target, spec_type="mtp", draft_model=both.assistant) as rt,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(MtpDrafter, "accept", spy)
        ref = run(rt, prompt, greedy())
        assert ref == before[1:] and rt.stats.stop_reason == "eog"  # (EOS itself not emitted)
        inside = 0
        for n in range(1, 9):
            seen.clear()
            assert run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n)) == ref, n
            assert rt.stats.stop_reason == "eog" and rt.stats.n_tokens == 7
            a, drafts = seen[-1]
            inside += EOS_ID in drafts[:a]  # EOS an accepted draft token, those after it dropped
        assert inside >= 4


def test_n_predict_ends_inside_a_draft(tmp_path):
    both = write_gemma4_pair(tmp_path, agree=1.0)
    with Runtime.load(both.target, spec_type="mtp", draft_model=both.assistant) as rt:
        prompt = _far_from_eos(both, 2)
        ref = run(rt, prompt, greedy(n_predict=20))
        for n_predict in range(0, 14):
            assert run(rt, prompt, greedy(spec_type="mtp", draft_n_max=4, n_predict=n_predict)) == ref[:n_predict]
            st = rt.stats
            assert st.stop_reason == "n_predict" and st.n_tokens == n_predict
            # every draft kept and none wasted: each pass drafts only what -n leaves (an uncapped last
            # pass would draft and keep more than that, the surplus cut off)
            assert st.n_accepted == st.n_drafted and st.n_drafted + st.n_verify == max(0, n_predict - 1)


def test_a_full_context(pair, partial):
    n_ctx = 40
    for p in (pair, partial):
        with Runtime.load(p.target, spec_type="mtp", draft_model=p.assistant) as rt:
            prompt = _far_from_eos(p, 20) if p.order else rt.tokenize(PROMPT)
            ref = run(rt, prompt, greedy(n_predict=-1, n_ctx=n_ctx))
            assert rt.stats.stop_reason == "ctx_full" and len(ref) == n_ctx - len(prompt) + 1
            for n in (1, 3, 6):
                out = run(rt, prompt, greedy(n_predict=-1, n_ctx=n_ctx, spec_type="mtp", draft_n_max=n))
                assert out == ref and rt.stats.stop_reason == "ctx_full", n


def test_sampling_keeps_plain_samplings_distribution(tmp_path):
    """The chi-square test of tests/test_sampling.py: the first three tokens of spec sampling with
    the assistant against plain sampling (disjoint seeds), and a biased acceptance rule caught. The
    bigram pair's top logit leads by ~10: temperature 8 spreads it (top-1 ~ 0.5)."""
    bigram = write_gemma4_pair(tmp_path, agree=0.7)
    sampling = {**SAMPLING, "temp": 8.0}
    with Runtime.load(bigram.target, spec_type="mtp", draft_model=bigram.assistant) as rt:
        prompt = _far_from_eos(bigram, 4)
        plain = _sample_runs(rt, prompt, "none", range(0, 600), sampling=sampling)
        accepted: list[int] = []
        spec = _sample_runs(rt, prompt, "mtp", range(600, 1200), accepted, sampling)
        assert 0.2 < np.mean(accepted) < 0.8, np.mean(accepted)  # (one draft a run: -n 3 leaves room for one)
        ps = _p_values(plain, spec)
        assert min(ps.values()) > SIG, ps

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Runtime, "_verify_sampled", staticmethod(biased_verify))
            wrong = _sample_runs(rt, prompt, "mtp", range(600, 1200), sampling=sampling)
        assert min(_p_values(plain, wrong).values()) < SIG


def test_an_assistant_for_another_target_is_one_line(pair, tmp_path):
    """Width, global head size, vocabulary: named before llama.cpp sees the pair (a head size that
    differs ran, reading the target's cache with the wrong stride)."""
    cases = (
        (
            dict(target_width=128),
            ModelFileError,
            "embedding_length_out = 128, and the target's gemma4.embedding_length = 64",
        ),
        (dict(assistant_dg=16), ModelFileError, "key_length = 16, and the target's gemma4.attention.key_length = 32"),
        (dict(assistant_extra_tokens=200), VocabMismatchError, "n_vocab 500 vs 300"),
        # (4 aborted inside llama.cpp, reading past the target's cache; 1 read it at the wrong stride)
        (
            dict(assistant_kv_heads=4),
            ModelFileError,
            "head_count_kv = 4 at block 0, and the target's .* = 2 at block 2",
        ),
        (dict(assistant_kv_heads=1), ModelFileError, "head_count_kv = 1 at block 0"),
    )
    for kw, err, line in cases:
        other = write_gemma4_pair(tmp_path, **kw).assistant
        with pytest.raises(err, match=line):
            Runtime.load(pair.target, spec_type="mtp", draft_model=other)
    with pytest.raises(ModelFileError, match="reads the target's memory: use it with spec_type mtp"):
        Runtime.load(pair.target, spec_type="draft", draft_model=pair.assistant)


def test_head_count_kv_left_out_means_head_count_as_in_llama_cpp(tmp_path):
    """Neither file says head_count_kv (llama.cpp reads head_count for it): the pair fits."""
    from dataclasses import replace

    from tests.gemma4_pair import TINY

    p = write_gemma4_pair(tmp_path, dims=replace(TINY, n_head_kv=None))
    with Runtime.load(p.target, spec_type="mtp", draft_model=p.assistant) as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy(n_predict=16))
        assert run(rt, prompt, greedy(n_predict=16, spec_type="mtp", draft_n_max=3)) == ref
        assert rt.stats.n_drafted > 0


def test_generate_takes_llama_cpps_spelling_draft_mtp(tmp_path):
    """`generate -m TARGET -md ASSISTANT --spec-type draft-mtp` (llama.cpp's name) and `mtp` alike."""
    import json

    both = write_gemma4_pair(tmp_path, agree=0.7)

    def gen(*extra: str) -> dict:
        args = ["generate", "-m", str(both.target), "-p", "the cat", "-n", "24", "--temp", "0", "-t", "1", "--json"]
        r = CliRunner().invoke(main, [*args, *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    plain = gen()
    for spec in ("mtp", "draft-mtp"):
        out = gen("-md", str(both.assistant), "--spec-type", spec, "--spec-draft-n-max", "3")
        assert out["text"] == plain["text"] and out["stats"]["n_accepted"] > 0, spec


def test_a_target_whose_last_blocks_reuse_earlier_kv(tmp_path):
    """E2B-style KV sharing: the target's blocks 2-3 reuse blocks 0-1's cache, and the assistant's
    reads are redirected there (llama.cpp's reuse callback); the pair fits and keeps plain output."""
    from dataclasses import replace

    from tests.gemma4_pair import TINY

    for agree in (None, 1.0):
        p = write_gemma4_pair(
            tmp_path, agree=agree, dims=replace(TINY, pattern=(True, False, True, False), shared_kv=2)
        )
        with Runtime.load(p.target, spec_type="mtp", draft_model=p.assistant) as rt:
            prompt = rt.tokenize(PROMPT)
            ref = run(rt, prompt, greedy(n_predict=24))
            for n in (1, 3, 6):
                assert run(rt, prompt, greedy(n_predict=24, spec_type="mtp", draft_n_max=n)) == ref, (agree, n)
            assert rt.stats.n_drafted > 0 and (agree is None or rt.stats.acceptance == 1.0)
