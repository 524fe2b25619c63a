"""--repeat-penalty, --repeat-last-n and --ignore-eos (sampling.RowEdits): the rows edited as llama.cpp's
own penalties and logit-bias samplers edit them, and generation with them, drafted or not, equal to
plain decoding through llama.cpp's own sampler chain.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llama_cpp import llama_cpp as C

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.errors import ConfigError
from mtp_cli.runtime import Runtime
from mtp_cli.sampling import RowEdits
from tests.factory import TinySpec, token_permutation
from tests.parity import PROMPT, SENSITIVE, THREADS, greedy, run


def _llama_penalized(
    row: np.ndarray, history: list[int], last_n: int, penalty: float, freq: float = 0.0, presence: float = 0.0
) -> np.ndarray:
    """`row` through llama.cpp's penalties sampler after it accepted `history`."""
    smpl = C.llama_sampler_init_penalties(len(row), last_n, penalty, freq, presence)
    try:
        for t in history:
            C.llama_sampler_accept(smpl, t)
        data = (C.llama_token_data * len(row))(*[C.llama_token_data(i, float(v), 0.0) for i, v in enumerate(row)])
        arr = C.llama_token_data_array(data, len(row), -1, False)
        C.llama_sampler_apply(smpl, ctypes.byref(arr))
        out = np.empty_like(row)
        for d in data:
            out[d.id] = d.logit
        return out
    finally:
        C.llama_sampler_free(smpl)


@pytest.mark.parametrize("last_n", [1, 5, 64])
def test_rows_are_penalized_as_llama_cpp_penalizes_them(last_n):
    rng = np.random.default_rng(last_n)
    V = 50
    history = rng.integers(0, V, 40).tolist()
    drafts = rng.integers(0, V, 3).tolist()
    rows = rng.normal(0, 3, (4, V)).astype(np.float32)
    edited = rows.copy()
    RowEdits(GenConfig(repeat_penalty=1.7, repeat_last_n=last_n), ()).apply(edited, history, drafts)
    for i in range(4):
        want = _llama_penalized(rows[i], history + drafts[:i], last_n, 1.7)
        np.testing.assert_array_equal(edited[i], want, err_msg=f"row {i}")
    assert not np.array_equal(edited, rows)


def test_ignore_eos_masks_every_eog_token_and_nothing_else():
    rows = np.zeros((2, 10), dtype=np.float32)
    RowEdits(GenConfig(ignore_eos=True), [2, 7]).apply(rows, [1, 2, 3])
    assert np.isneginf(rows[:, [2, 7]]).all() and (np.delete(rows, [2, 7], axis=1) == 0).all()
    edits = RowEdits(GenConfig(), [2, 7])
    assert not edits.active


def _reference(model_path, prompt: list[int], n: int, *, penalty: float, last_n: int, ignore_eos: bool) -> list[int]:
    """Plain decoding, one token a pass, through llama.cpp's own chain: EOG bias, penalties, greedy."""
    m = lx.load_model(model_path)
    ctx = lx.create_context(m, n_ctx=256, n_batch=64, n_threads=THREADS)
    params = C.llama_sampler_chain_default_params()
    chain = C.llama_sampler_chain_init(params)
    try:
        if ignore_eos:
            eog = lx.eog_tokens(m)
            biases = (C.llama_logit_bias * len(eog))(*[C.llama_logit_bias(t, -float("inf")) for t in eog])
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_logit_bias(lx.n_vocab(m), len(eog), biases))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_penalties(lx.n_vocab(m), last_n, penalty, 0.0, 0.0))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
        for t in prompt:
            C.llama_sampler_accept(chain, t)
        b = lx.Batch(64)
        b.add_many(np.asarray(prompt, dtype=np.int32), 0, logits_last=True)
        lx.decode(ctx, b)
        out: list[int] = []
        while len(out) < n:
            tok = int(C.llama_sampler_sample(chain, ctx, -1))
            if lx.is_eog(m, tok):
                break
            out.append(tok)
            b.clear()
            b.add(tok, len(prompt) + len(out) - 1, logits=True)
            lx.decode(ctx, b)
        return out
    finally:
        C.llama_sampler_free(chain)
        ctx.close()
        m.close()


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_penalized_generation_drafted_or_not_equals_llama_cpps_chain(tiny_models, arch):
    s = tiny_models(arch, head_noise=1.0, **SENSITIVE)
    kw = dict(repeat_penalty=1.5, repeat_last_n=24)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        p0 = rt.tokenize(PROMPT)
        prompt = p0 + run(rt, p0, greedy(n_predict=10)) + p0[1:]  # what follows is in the window
        ref = _reference(s["full"], prompt, 40, penalty=1.5, last_n=24, ignore_eos=False)
        assert ref != run(rt, prompt, greedy())  # the penalty changes this text
        for spec, n in (("none", 1), ("mtp", 1), ("mtp", 3), ("ngram", 3), ("lookup", 16)):
            assert run(rt, prompt, greedy(spec_type=spec, draft_n_max=n, **kw)) == ref, (spec, n)
            if spec == "mtp":
                assert rt.stats.n_accepted > 0


def test_ignore_eos_generates_past_the_end_as_llama_cpp_does(tiny_models):
    arch = "glm4moe"
    perm = token_permutation(TinySpec(arch=arch))
    with Runtime.load(tiny_models(arch)["trunk"]) as rt:
        trig = rt.tokenize(PROMPT)[-1]
    for _ in range(5):
        trig = int(perm[trig])  # the 5th generated token; EOS follows it
    s = tiny_models(arch, head_noise=0.0, eos_after=trig)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        ended = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=3))
        assert rt.stats.stop_reason == "eog" and len(ended) == 5
        ref = _reference(s["full"], prompt, 30, penalty=1.0, last_n=0, ignore_eos=True)
        assert len(ref) == 30 and ref[:5] == ended
        scans: list[int] = []
        real = lx.eog_tokens
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lx, "eog_tokens", lambda m: scans.append(1) or real(m))
            for spec, n in (("none", 1), ("mtp", 3)):
                out = run(rt, prompt, greedy(spec_type=spec, draft_n_max=n, n_predict=30, ignore_eos=True))
                assert out == ref and rt.stats.stop_reason == "n_predict", (spec, n)
        assert len(scans) <= 1  # the vocabulary is scanned once per model, not per generation


@pytest.mark.parametrize(
    "bad, names",
    [
        (dict(repeat_penalty=0.0), "repeat_penalty"),
        (dict(repeat_last_n=-1), "repeat_last_n"),
        (dict(cache_type_k="q9"), "cache_type_k"),
        (dict(cache_type_v="q4_0", flash_attn=False), "cache_type_v"),
        (dict(n_ubatch=0), "n_ubatch"),
    ],
)
def test_bad_settings_are_refused_by_name(bad, names):
    with pytest.raises(ConfigError, match=names):
        GenConfig(**bad).validated()


@pytest.mark.parametrize("bad, names", [(dict(load_mode="swap"), "load_mode"), (dict(n_parallel=0), "n_parallel")])
def test_bad_load_settings_are_refused_by_name(bad, names):
    from mtp_cli.config import LoadConfig

    with pytest.raises(ConfigError, match=names):
        LoadConfig(**bad).validated()


def test_a_small_ubatch_on_a_recurrent_target_is_raised_instead_of_aborting(tiny_models):
    """-ub 2 with N = 3 on qwen35 aborted the process (llama-batch.cpp: n_ubatch > n_rs_seq + 1)."""
    import subprocess
    import sys

    s = tiny_models("qwen35", head_noise=1.0, **SENSITIVE)
    code = (
        "from mtp_cli.config import GenConfig; from mtp_cli.runtime import Runtime; import sys\n"
        "cfg = lambda **k: GenConfig(n_predict=24, n_ctx=256, n_threads=1, temp=0.0, **k)\n"
        f"rt = Runtime.load({str(s['full'])!r}, spec_type='mtp'); p = rt.tokenize('hello world')\n"
        "ref = [e.token for e in rt.generate(p, cfg())]\n"
        "out = [e.token for e in rt.generate(p, cfg(spec_type='mtp', draft_n_max=3, n_ubatch=2))]\n"
        "sys.exit(0 if out == ref else 3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert "n_ubatch 2 raised to 5" in r.stderr
