"""The runtime and its verify loop (mtp_cli.runtime, mtp_cli.loop): long prompts in chunks, stops
(EOG inside a draft, n_predict, a full context), p_min / n_min, stats, interruption, refusals,
recurrent rollback. One thread (see tests/parity.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.errors import ConfigError, ModelFileError, MtpError, NoMtpHeadError
from mtp_cli.runtime import Runtime
from tests.factory import EOS_ID, TinySpec, token_permutation
from tests.parity import ARCHS, NS, PROMPT, SENSITIVE, THREADS, _one_line, check_prefix_reuse, greedy, run


@pytest.fixture(scope="session")
def models(tiny_models):
    return tiny_models


@pytest.mark.parametrize("arch", ARCHS)
def test_long_prompt_in_small_batches(models, arch):
    """A prompt longer than n_batch is decoded in chunks; the MTP / draft-model catch-up queues
    flush along the way and the output still equals plain decoding."""
    s = models(arch, head_noise=1.0, **SENSITIVE)
    d = models(arch, perturb=0.35)
    text = " ".join(["hello world the a"] * 10)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(text)
        assert len(prompt) > 30
        ref = run(rt, prompt, greedy(n_batch=512))
        for spec, n in (("none", 1), ("mtp", 1), ("mtp", 5), ("ngram", 3), ("lookup", 16)):
            out = run(rt, prompt, greedy(spec_type=spec, draft_n_max=n, n_batch=8))
            assert out == ref, (spec, n)
            if spec == "mtp":
                assert rt.stats.n_accepted > 0
    with Runtime.load(s["full"], spec_type="draft", draft_model=d["trunk"]) as rt:
        for n in (1, 4):
            assert run(rt, prompt, greedy(spec_type="draft", draft_n_max=n, n_batch=8)) == ref


@pytest.mark.parametrize("arch", ARCHS)
def test_eog_inside_an_accepted_draft(models, arch):
    perm = token_permutation(TinySpec(arch=arch))
    s0 = models(arch)
    with Runtime.load(s0["trunk"]) as rt:
        last = rt.tokenize(PROMPT)[-1]
    trig = last
    for _ in range(7):
        trig = int(perm[trig])  # the 7th generated token; EOS follows it
    s = models(arch, head_noise=0.0, eos_after=trig)
    seen: list[tuple[int, list[int]]] = []
    orig = MtpDrafter.accept

    def spy(self, n_accepted, drafts):
        seen.append((n_accepted, list(drafts)))
        return orig(self, n_accepted, drafts)

    with Runtime.load(s["full"], spec_type="mtp") as rt, pytest.MonkeyPatch.context() as mp:
        mp.setattr(MtpDrafter, "accept", spy)
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        assert rt.stats.stop_reason == "eog" and len(ref) == 7 and ref[-1] == trig
        inside = 0
        for n in NS:
            seen.clear()
            out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n))
            assert out == ref and rt.stats.stop_reason == "eog" and rt.stats.n_tokens == 7
            a, drafts = seen[-1]
            inside += EOS_ID in drafts[:a]  # EOS was an accepted draft token, tokens after it dropped
        assert inside >= 3


@pytest.mark.parametrize("arch", ARCHS)
def test_n_predict_ends_inside_a_draft(models, arch):
    s = models(arch, head_noise=0.0)  # every draft accepted: n_predict always falls inside one
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy(n_predict=20))
        for n_predict in range(0, 14):
            out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=4, n_predict=n_predict))
            assert out == ref[:n_predict]
            assert rt.stats.stop_reason == "n_predict" and rt.stats.n_tokens == n_predict
            st = rt.stats  # capped drafts: every one kept, and none drafted past what -n leaves
            assert st.n_accepted == st.n_drafted and st.n_drafted + st.n_verify == max(0, n_predict - 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_context_fills(models, arch):
    s = models(arch, head_noise=1.5)
    d = models(arch, perturb=0.35)
    n_ctx = 24
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        expect = n_ctx - len(prompt) + 1  # the last token is sampled from the last position's logits
        ref = run(rt, prompt, greedy(n_predict=-1, n_ctx=n_ctx))
        assert rt.stats.stop_reason == "ctx_full" and len(ref) == expect
        for spec, n in (("mtp", 1), ("mtp", 3), ("mtp", 6), ("ngram", 4)):
            out = run(rt, prompt, greedy(n_predict=-1, n_ctx=n_ctx, spec_type=spec, draft_n_max=n))
            assert out == ref and rt.stats.stop_reason == "ctx_full", (spec, n)
        with pytest.raises(ConfigError, match="context holds"):
            rt.generate(list(range(3, 3 + n_ctx + 1)), greedy(n_ctx=n_ctx))
    with Runtime.load(s["trunk"], spec_type="draft", draft_model=d["trunk"]) as rt:
        out = run(rt, prompt, greedy(n_predict=-1, n_ctx=n_ctx, spec_type="draft", draft_n_max=5))
        assert out == ref and rt.stats.stop_reason == "ctx_full"


def test_p_min_and_n_min(models):
    s = models("glm4moe", head_noise=1.5)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        base = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=4))
        drafted = rt.stats.n_drafted
        assert base == ref
        out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=4, draft_p_min=0.9))
        assert out == ref and rt.stats.n_drafted < drafted and rt.stats.acceptance > 0.0
        out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=4, draft_p_min=1.0))
        assert out == ref and rt.stats.n_drafted == 0  # nothing is that confident
        out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=4, draft_p_min=0.9, draft_n_min=3))
        assert out == ref and all(c == rt.stats.drafted_at[0] for c in rt.stats.drafted_at[:3])


def test_stats_are_consistent(models):
    s = models("qwen35", head_noise=1.5)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        events = list(rt.generate(prompt, greedy(spec_type="mtp", draft_n_max=3, n_predict=60)))
        st = rt.stats
        text = rt.detokenize([ev.token for ev in events])
    with pytest.raises(MtpError, match="closed"):
        rt.tokenize("x")
    assert st.n_tokens == len(events) == 60 and st.n_prompt == len(prompt)
    src = Counter(ev.source for ev in events)
    assert src["draft"] == st.n_accepted and src["target"] == 1 + st.n_verify
    assert st.n_drafted == sum(st.drafted_at) and st.n_accepted == sum(st.accepted_at)
    assert [ev.step for ev in events] == sorted(ev.step for ev in events) and events[-1].step == st.n_verify
    assert 0 < st.t_target_decode + st.t_draft_decode <= st.t_gen and st.t_prompt > 0
    assert st.n_draft_decode >= st.n_verify
    assert "".join(ev.text for ev in events) == text
    d = st.to_dict()
    assert d["stop_reason"] == "n_predict" and d["acceptance"] == st.acceptance and d["t_overhead"] >= 0


@pytest.mark.parametrize("arch", ARCHS)
def test_keyboard_interrupt_leaves_stats_valid(models, arch):
    s = models(arch, head_noise=1.5)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        cfg = greedy(spec_type="mtp", draft_n_max=3)
        # Ctrl-C delivered while the generator is suspended at a yield
        gen = rt.generate(prompt, cfg)
        got = [next(gen).token for _ in range(5)]
        with pytest.raises(StopIteration):
            gen.throw(KeyboardInterrupt)
        st = rt.stats
        assert st.stop_reason == "interrupted" and st.n_tokens == 5 and got == ref[:5]
        assert st.t_gen >= 0 and st.n_accepted <= st.n_drafted
        # Ctrl-C inside llama_decode (delivered when the C call returns)
        calls = {"n": 0}
        real = lx.decode

        def flaky(ctx, batch):
            calls["n"] += 1
            if calls["n"] == 12:
                raise KeyboardInterrupt
            return real(ctx, batch)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lx, "decode", flaky)
            out = run(rt, prompt, cfg)  # ends normally
        st = rt.stats
        assert st.stop_reason == "interrupted" and st.n_tokens == len(out) and out == ref[: len(out)]

        # a llama.cpp failure propagates, with stop_reason "error"
        def failing(ctx, batch):
            calls["n"] += 1
            if calls["n"] == 12:
                raise lx.LlamaError("llama_decode failed with code 1")
            return real(ctx, batch)

        calls["n"] = 0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lx, "decode", failing)
            with pytest.raises(lx.LlamaError):
                run(rt, prompt, cfg)
        assert rt.stats.stop_reason == "error"
        # the consumer stops early
        gen = rt.generate(prompt, cfg)
        next(gen)
        gen.close()
        assert rt.stats.stop_reason == "interrupted" and rt.stats.n_tokens == 1
        # and the runtime is fine afterwards
        assert run(rt, prompt, cfg) == ref


def test_refusals(models, tmp_path):
    s = models("qwen35")
    with pytest.raises(NoMtpHeadError) as e:
        Runtime.load(s["trunk"], spec_type="mtp")
    msg = _one_line(e)
    assert "mtp-cli pack" in msg and "draft_model" in msg and "spec_type ngram" in msg and "--" not in msg
    with pytest.raises(NoMtpHeadError) as e:
        Runtime.load(s["full"], spec_type="mtp", draft_model=s["trunk"])  # -md without a head
    _one_line(e)
    with pytest.raises(MtpError, match="sidecar") as e:
        Runtime.load(s["sidecar"])
    _one_line(e)
    with pytest.raises(ConfigError, match="draft_model") as e:
        Runtime.load(s["trunk"], spec_type="draft")
    _one_line(e)
    with pytest.raises(ModelFileError, match="spec_type mtp") as e:
        Runtime.load(s["trunk"], spec_type="draft", draft_model=s["sidecar"])
    _one_line(e)
    with pytest.raises(ConfigError, match="spec type"):
        Runtime.load(s["trunk"], spec_type="medusa")
    # files: missing, not a GGUF, truncated; llama.cpp never sees them
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(s["trunk"]).read_bytes()[:5000])
    for bad in (tmp_path / "missing.gguf", junk, cut):
        with pytest.raises(ModelFileError) as e:
            Runtime.load(bad)
        assert bad.name in _one_line(e)
        with pytest.raises(ModelFileError) as e:
            Runtime.load(s["trunk"], spec_type="draft", draft_model=bad)
        assert "draft model" in _one_line(e)
    # values
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        for kw, pat in (
            (dict(draft_n_max=0), "draft_n_max"),
            (dict(draft_n_max=33), "draft_n_max"),
            (dict(draft_n_max=2, draft_n_min=3), "draft_n_min"),
            (dict(draft_p_min=1.5), "draft_p_min"),
            (dict(draft_p_min=-0.1), "draft_p_min"),
        ):
            with pytest.raises(ConfigError, match=pat) as e:
                rt.generate(prompt, greedy(spec_type="mtp", **kw))
            _one_line(e)
        for kw, pat in (
            (dict(n_predict=-2), "n_predict"),
            (dict(n_ctx=-1), "n_ctx"),
            (dict(temp=1.0, top_p=0.0), "top_p"),
            (dict(spec_type="nope"), "spec type"),
        ):
            with pytest.raises(ConfigError, match=pat):
                rt.generate(prompt, greedy(**kw))
        with pytest.raises(ConfigError, match="empty"):
            rt.generate([], greedy())
        with pytest.raises(ConfigError, match="vocabulary"):
            rt.generate([1, 100000], greedy())
        with pytest.raises(MtpError, match="draft model"):
            rt.generate(prompt, greedy(spec_type="draft"))
    with Runtime.load(s["full"]) as rt:  # loaded without the head
        with pytest.raises(ConfigError, match="spec_type='mtp'"):
            rt.generate(rt.tokenize(PROMPT), greedy(spec_type="mtp"))


def test_recurrent_rollback_facts(models):
    """The llama.cpp facts the runtime relies on (qwen35 hybrid memory, target n_rs_seq = N):
    removing r <= n_rs_seq trailing positions of the last batch is exact while the batch keeps at
    least one token; a second removal before the next decode is refused; r > n_rs_seq is refused."""
    s = models("qwen35", weights="random")
    m = lx.load_model(s["trunk"])
    toks = [1, 50, 60, 70, 80, 90, 100, 110, 120, 130]

    def last_logits(n_rs: int, plan: list) -> Optional[np.ndarray]:
        ctx = lx.create_context(m, n_ctx=64, n_batch=32, n_threads=THREADS, n_rs_seq=n_rs)
        b = lx.Batch(32)
        try:
            for op, arg in plan:
                if op == "dec":
                    b.clear()
                    b.add_many([t for t, _ in arg], arg[0][1], logits_last=True)
                    lx.decode(ctx, b)
                elif not lx.memory_seq_rm(ctx, 0, arg, -1):
                    return None
            return lx.logits_rows(ctx, 1, lx.n_vocab(m))[0].copy()
        finally:
            ctx.close()

    def seq(a: int, b: int) -> list:
        return [(toks[i], i) for i in range(a, b)]

    ref = last_logits(0, [("dec", seq(0, 10))])
    junk = lambda p0, n: [(200 + i, p0 + i) for i in range(n)]  # noqa: E731
    try:
        for keep in (1, 2):
            for r in (1, 2, 3):  # verify batch [keep real tokens + r rejected drafts], n_rs_seq = 3
                got = last_logits(
                    3,
                    [
                        ("dec", seq(0, 5)),
                        ("dec", seq(5, 5 + keep) + junk(5 + keep, r)),
                        ("rm", 5 + keep),
                        ("dec", seq(5 + keep, 10)),
                    ],
                )
                assert got is not None and np.array_equal(got, ref), (keep, r)
        # too far back, or twice before a decode: refused
        assert last_logits(2, [("dec", seq(0, 5)), ("dec", seq(5, 6) + junk(6, 3)), ("rm", 6)]) is None
        assert last_logits(3, [("dec", seq(0, 5)), ("dec", seq(5, 6) + junk(6, 3)), ("rm", 8), ("rm", 7)]) is None
        # removing the WHOLE last batch is accepted but restores a stale state (why id_last stays in it)
        got = last_logits(3, [("dec", seq(0, 5)), ("dec", junk(5, 2)), ("rm", 5), ("dec", seq(5, 10))])
        assert got is not None and not np.allclose(got, ref, atol=1e-3)
    finally:
        m.close()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", ["none", "mtp", "ngram"])
def test_a_prompt_that_extends_the_last_generation_decodes_only_its_new_tokens(models, arch, spec):
    """The next turn of a chat: the memory keeps the last generation's prompt and tokens, the new
    prompt's tokens alone are decoded, and the output is what a full prefill gives."""
    s = models(arch, **SENSITIVE)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        cfg = greedy(spec_type=spec, draft_n_max=3, n_predict=12)
        p1 = rt.tokenize(PROMPT)
        out1 = run(rt, p1, cfg)
        turns = [p1 + out1 + rt.tokenize(" the world a", add_special=False)]
        reused = [ev.token for ev in rt.generate(turns[0], cfg, reuse=True)]
        assert rt.stats.n_cached == len(p1) + len(out1) - 1  # all but the last token, never decoded
        accepted = [rt.stats.n_accepted]
        turns.append(turns[0] + reused + rt.tokenize(" hello", add_special=False))
        third = [ev.token for ev in rt.generate(turns[1], cfg, reuse=True)]
        assert rt.stats.n_cached == len(turns[0]) + len(reused) - 1
        accepted.append(rt.stats.n_accepted)
        for prompt, got, acc in zip(turns, (reused, third), accepted):
            fresh = run(rt, prompt, cfg)  # reuse=False: a full prefill
            assert rt.stats.n_cached == 0 and got == fresh, (arch, spec)
            assert acc == rt.stats.n_accepted, (arch, spec, acc, rt.stats.n_accepted)  # the drafter continued right
        # a prompt that leaves the memory's tokens part-way keeps the prefix they share (a recurrent
        # target, whose state cannot drop a tail, decodes it whole), with a full prefill's output
        edited = p1 + [p1[-1]]
        got = [ev.token for ev in rt.generate(edited, cfg, reuse=True)]
        assert rt.stats.n_cached == (0 if rt.recurrent else len(p1))
        assert got == run(rt, edited, cfg), (arch, spec)


@pytest.mark.parametrize("spec", ["none", "mtp", "ngram", "lookup,mtp"])
@pytest.mark.parametrize("sleep", [False, True])
def test_the_longest_common_prefix_is_kept_regenerate_and_edits_give_a_fresh_prefills_output(models, spec, sleep):
    """Regenerate (the same prompt again), an edited last turn, a shared head: the memory keeps
    what the new prompt shares with it and drops the rest (the MTP head too, asleep or not); the
    output is a full prefill's."""
    s = models("glm4moe", **SENSITIVE)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        check_prefix_reuse(rt, greedy(spec_type=spec, draft_n_max=3, n_predict=10), sleep)


def test_flash_attention_is_off_where_attention_runs_on_the_cpu_unless_asked():
    """llama.cpp's auto turns flash attention on wherever the device has the op, and its CPU kernel
    reads the cache a query row at a time (2-3x slower past ~100 positions, and in every verify
    batch): on a CPU-only placement auto means off; a given setting, quantized KV cells (a
    quantized V needs it) or offloaded layers leave llama.cpp's choice."""
    from mtp_cli.config import GenConfig
    from mtp_cli.contexts import flash_attn_for

    assert flash_attn_for(GenConfig(), auto_off=True) is False
    assert flash_attn_for(GenConfig(cache_type_k="bf16", cache_type_v="f32"), auto_off=True) is False
    assert flash_attn_for(GenConfig(), auto_off=False) is None
    assert flash_attn_for(GenConfig(flash_attn=True), auto_off=True) is True
    assert flash_attn_for(GenConfig(flash_attn=False), auto_off=False) is False
    for quantized in (dict(cache_type_k="q8_0"), dict(cache_type_v="q4_0")):
        assert flash_attn_for(GenConfig(**quantized), auto_off=True) is None
    from mtp_cli.config import LoadConfig
    from mtp_cli.contexts import fa_auto_off

    assert fa_auto_off(LoadConfig(), "llama")  # (this build offloads nothing: the tests' CPU)
    assert not fa_auto_off(LoadConfig(), "minimax-m3")  # (its sparse attention runs dense without it)


def test_a_cpu_runtime_creates_its_target_and_head_contexts_without_flash_attention(models, monkeypatch):
    """Every context of a generation gets the same resolved setting (Gemma 4's assistant reads the
    target's cells: it must match; glm4moe's head keeps its own); a placement that offloads layers
    keeps llama.cpp's auto, `-ngl 0` and `-dev none` do not."""
    from mtp_cli.config import Placement

    s = models("glm4moe")
    made: list[dict] = []
    real = lx.create_context
    monkeypatch.setattr(lx, "create_context", lambda *a, **k: made.append(k) or real(*a, **k))
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        assert rt.fa_auto_off
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        assert run(rt, prompt, greedy(spec_type="mtp", draft_n_max=3)) == ref
        assert rt.stats.n_accepted > 0
        assert len(made) >= 2 and all(k["kv"].flash_attn is False for k in made)
        made.clear()
        run(rt, prompt, greedy(flash_attn=True, spec_type="mtp", draft_n_max=3))
        assert made and all(k["kv"].flash_attn is True for k in made)
    monkeypatch.setattr(lx, "supports_gpu_offload", lambda: True)  # (as a GPU build or --rpc)
    for fields, off in ((dict(), False), (dict(n_gpu_layers=0), True), (dict(device=("none",)), True)):
        placement = Placement(device=fields.pop("device")) if "device" in fields else Placement()
        with Runtime.load(s["full"], spec_type="none", placement=placement, **fields) as rt:
            assert rt.fa_auto_off is off, fields
            run(rt, rt.tokenize(PROMPT), greedy(n_predict=2))
