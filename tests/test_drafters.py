"""The drafters (mtp_cli.drafters): greedy parity with plain decoding for every spec type and N, the
MTP head's pairing, chained heads, draft models with recurrent state, and a mutation check of the
parity test itself. One thread (see tests/parity.py).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.drafters.model import ModelDrafter
from mtp_cli.drafters.mtp import MtpDrafter
from mtp_cli.errors import VocabMismatchError
from mtp_cli.runtime import Runtime
from tests import factory
from tests.factory import TinySpec, add_tiny_vocab, tiny_model_set, tiny_vocab, token_permutation
from tests.parity import (
    ARCHS,
    PROMPT,
    SENSITIVE,
    SUMMARY,
    THREADS,
    TIE_EPS,
    _one_line,
    _parity_sweep,
    baseline_gaps,
    check_prefix_reuse,
    compare,
    greedy,
    run,
)


@pytest.fixture(scope="session")
def models(tiny_models):
    return tiny_models


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if SUMMARY:
        print("\n--- drafter parity summary ---\n" + "\n".join(SUMMARY))


@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_parity_every_n(models, arch, record_property):
    s = models(arch, head_noise=1.0, **SENSITIVE)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        perm = token_permutation(TinySpec(arch=arch))
        off_p = sum(perm[x] != y for x, y in zip([prompt[-1]] + ref, ref))
        assert off_p >= 5  # context matters
        acc, ties = _parity_sweep(
            rt, s["full"], prompt, "mtp", f"{arch} mtp (own head, noise 1.0, mix 2)", record_property
        )
    assert 0.2 < acc < 0.95  # the accept AND the reject/rollback paths both ran


@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_sidecar_parity(models, arch, record_property):
    """trunk (-m) + MTP-only sidecar (-md): the same tokens and the same drafts as the full file."""
    s = models(arch, head_noise=1.5, **SENSITIVE)
    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        full = [(run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n)), rt.stats.n_accepted) for n in (1, 3, 6)]
    with Runtime.load(s["trunk"], spec_type="mtp", draft_model=s["sidecar"]) as rt:
        assert rt.models.drafting is not rt.model
        side = [(run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n)), rt.stats.n_accepted) for n in (1, 3, 6)]
        _parity_sweep(rt, s["trunk"], prompt, "mtp", f"{arch} mtp (trunk + sidecar, noise 1.5, mix 2)", record_property)
    assert side == full


@pytest.mark.parametrize("arch", ARCHS)
def test_first_draft_uses_the_design3_pairing(models, arch):
    """Every first draft token equals the head's argmax when the head sees the whole sequence with
    ARCHITECTURE §3 pairing (x_p with the target's h of p-1) in one batch: the catch-up feeds the MTP
    context exactly the right rows (a wrong pairing keeps parity but silently lowers acceptance)."""
    s = models(arch, head_noise=1.5)
    firsts: list[tuple[int, int]] = []
    orig = MtpDrafter.drafting

    def spy(self, id_last, pos, n_max):
        out = yield from orig(self, id_last, pos, n_max)
        if out:
            firsts.append((pos, out[0]))
        return out

    with Runtime.load(s["full"], spec_type="mtp") as rt, pytest.MonkeyPatch.context() as mp:
        mp.setattr(MtpDrafter, "drafting", spy)
        prompt = rt.tokenize(PROMPT)
        seq = prompt + run(rt, prompt, greedy(spec_type="mtp", draft_n_max=2))
    assert len(firsts) > 10
    head = _head_logits(s["full"], seq)  # one target pass over the sequence, one head pass with shifted h rows
    top2 = np.sort(head, axis=1)[:, -2:]
    for pos, d1 in firsts:
        if int(head[pos].argmax()) != d1:
            assert top2[pos, 1] - top2[pos, 0] < TIE_EPS, f"first draft at pos {pos}: {d1} vs head {head[pos].argmax()}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("draft_arch", ARCHS)
def test_draft_model_parity_every_n(models, arch, draft_arch, record_property):
    """A separate draft model that agrees with the target on ~2/3 of the tokens. A qwen35 draft
    has recurrent state (rolled back through a saved checkpoint), a glm4moe draft only KV."""
    s = models(arch, **SENSITIVE)
    d = models(draft_arch, perturb=0.35)
    with Runtime.load(s["trunk"], spec_type="draft", draft_model=d["trunk"]) as rt:
        assert rt.models.drafting is not None
        prompt = rt.tokenize(PROMPT)
        acc, _ = _parity_sweep(
            rt, s["trunk"], prompt, "draft", f"{arch} draft={draft_arch} (perturbed 35%)", record_property
        )
        drafter = rt._ctx.drafters["draft", 0]  # type: ignore[union-attr]
        assert isinstance(drafter, ModelDrafter) and drafter.recurrent == (draft_arch == "qwen35")
    assert 0.2 < acc < 0.95


def test_parity_catches_a_stale_recurrent_rollback(models):
    """Mutation check of the parity test itself. A runtime that, instead of removing only the
    rejected drafts, removes the WHOLE verify batch and re-decodes [id_last, accepted...] looks
    equivalent, and llama.cpp accepts that removal (with n_rs_seq >= N+1) -- but it restores a
    stale recurrent snapshot. On the context-sensitive model the output diverges from plain
    decoding at a non-tie, so the parity sweep would catch it."""
    s = models("qwen35", head_noise=1.0, **SENSITIVE)
    real_rm, real_create, real_decode = lx.memory_seq_rm, lx.create_context, lx.decode
    last: dict[int, tuple[int, np.ndarray]] = {}

    def create(model, **kw):
        if kw.get("ctx_type", lx.CTX_TYPE_TARGET) == lx.CTX_TYPE_TARGET and kw.get("n_rs_seq"):
            kw["n_rs_seq"] += 1
        return real_create(model, **kw)

    def decode(ctx, batch):
        real_decode(ctx, batch)
        last[id(ctx)] = (int(batch.pos[0]), batch.tokens[: batch.n_tokens].copy())

    with Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        gaps = baseline_gaps(s["full"], prompt, ref)

        def rm(ctx, seq_id, p0, p1=-1):
            if rt._ctx is None or ctx is not rt._ctx.target:
                return real_rm(ctx, seq_id, p0, p1)
            first, toks = last[id(ctx)]
            if not real_rm(ctx, seq_id, first, -1):  # the whole verify batch
                return False
            b = lx.Batch(len(toks))
            b.add_many(toks[: p0 - first], first)
            b.logits[: b.n_tokens] = 1
            real_decode(ctx, b)
            return True

        caught = 0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lx, "create_context", create)
            mp.setattr(lx, "decode", decode)
            mp.setattr(lx, "memory_seq_rm", rm)
            for n in (2, 3, 4):
                rt.close_contexts()
                out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n))
                try:
                    compare(ref, out, gaps, "mutant")
                except AssertionError:
                    caught += 1
        rt.close_contexts()
        assert run(rt, prompt, greedy(spec_type="mtp", draft_n_max=3)) == ref  # unpatched: fine again
    SUMMARY.append(f"stale-rollback mutant caught for {caught}/3 values of N")
    assert caught >= 2


def test_draft_model_same_as_target_accepts_everything(models):
    s = models("qwen35")
    with Runtime.load(s["trunk"], spec_type="draft", draft_model=s["trunk"]) as rt:
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        out = run(rt, prompt, greedy(spec_type="draft", draft_n_max=4))
        assert out == ref and rt.stats.acceptance == 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_ngram_parity_every_n(models, arch, record_property):
    """A prompt holding a stretch of the model's greedy cycle: the continuation repeats it, so
    prompt lookup drafts get accepted; later the lookups miss or mispredict."""
    s = models(arch, **SENSITIVE)
    perm = token_permutation(TinySpec(arch=arch))
    x = int(np.nonzero(perm >= 0)[0][10])
    cyc = [x]
    for _ in range(24):
        cyc.append(int(perm[cyc[-1]]))
    prompt = [1] + cyc + [200, 201, 202] + cyc[:3] + [203] + cyc[:1]
    with Runtime.load(s["trunk"], spec_type="ngram") as rt:
        acc, _ = _parity_sweep(
            rt, s["trunk"], prompt, "ngram", f"{arch} ngram (cycle prompt)", record_property, ngram_min=1, ngram_max=3
        )
        assert acc > 0.3
        acc, _ = _parity_sweep(rt, s["trunk"], prompt, "lookup", f"{arch} lookup (cycle prompt)", record_property)
        assert acc > 0.3


def write_tiny_mimo2(path: Path, *, n_heads: int, mix: float, head_noise: float, seed: int = 0) -> Path:
    """A tiny `mimo2` GGUF with `n_heads` chained MTP heads (the factory builds qwen35/glm4moe only,
    and both assert a single head; llama.cpp chains heads for step35 and mimo2). Dense FFNs, one
    sliding-window trunk layer (mimo2 uses an iSWA cache), structured like the factory's models:
    output = permuted embedding, each head's eh_proj passes the token embedding (+ noise)."""
    E, H, Hkv, D, F, n_trunk = 64, 4, 2, 16, 128, 2
    V = len(tiny_vocab()[0])
    rng = np.random.default_rng(seed)

    def lin(o: int, i: int, branch: bool = False) -> np.ndarray:
        w = (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)
        return w * mix if branch else w

    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    emb = rng.standard_normal((V, E)).astype(np.float32)
    perm = token_permutation(TinySpec(seed=seed))
    out = np.zeros((V, E), np.float32)
    src = np.nonzero(perm >= 0)[0]
    out[perm[src]] = emb[src]
    t = {"token_embd.weight": emb, "output_norm.weight": ones(E), "output.weight": out}
    n_layer = n_trunk + n_heads
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = ones(E)
        if il < n_trunk:
            t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"] = (
                lin(H * D, E),
                lin(Hkv * D, E),
                lin(Hkv * D, E),
            )
        else:
            t[p + "attn_qkv.weight"] = lin((H + 2 * Hkv) * D, E)  # the mimo2 MTP graph needs the fused form
        t[p + "attn_output.weight"] = lin(E, H * D, True)
        t[p + "ffn_norm.weight"] = ones(E)
        t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"], t[p + "ffn_down.weight"] = (
            lin(F, E),
            lin(F, E),
            lin(E, F, True),
        )
        if il >= n_trunk:
            eh = np.zeros((E, 2 * E), np.float32)
            eh[:, :E] = np.eye(E)
            eh += (rng.standard_normal((E, 2 * E)) * head_noise / math.sqrt(E)).astype(np.float32)
            t[p + "nextn.eh_proj.weight"] = eh
            t[p + "nextn.enorm.weight"], t[p + "nextn.hnorm.weight"] = ones(E), ones(E)
    w = gguf.GGUFWriter(path, "mimo2")
    w.add_name("tiny-mimo2")
    w.add_context_length(4096)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_nextn_predict_layers(n_heads)
    w.add_feed_forward_length(F)
    w.add_expert_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(V)
    w.add_sliding_window(64)
    w.add_sliding_window_pattern([il == 0 for il in range(n_layer)])
    add_tiny_vocab(w)
    for name, arr in t.items():
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_chained_heads_parity(tmp_path, record_property):
    path = write_tiny_mimo2(tmp_path / "mimo2-3heads.gguf", n_heads=3, mix=2.0, head_noise=1.0)
    firsts: list[tuple[int, int]] = []
    orig = MtpDrafter.drafting

    def spy(self, id_last, pos, n_max):
        out = yield from orig(self, id_last, pos, n_max)
        if out:
            firsts.append((pos, out[0]))
        return out

    with Runtime.load(path, spec_type="mtp") as rt:
        assert rt.n_heads == 3
        prompt = rt.tokenize(PROMPT)
        ref = run(rt, prompt, greedy())
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(MtpDrafter, "drafting", spy)
            acc, _ = _parity_sweep(
                rt, path, prompt, "mtp", "mimo2 chained heads x3 (noise 1.0, mix 2)", record_property
            )
            for n in (1, 2, 3, 4, 6):
                run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n))
                assert rt.stats.n_max == min(n, 3)  # one head per draft step
                if n >= 3:
                    assert rt.stats.drafted_at[2] > 0 and rt.stats.accepted_at[1] > 0
        assert isinstance(rt._ctx.drafters["mtp", 0], MtpDrafter) and rt._ctx.drafters["mtp", 0].chain  # type: ignore[union-attr]
        for sleep in (False, True):  # every head drops its rows past a kept prefix
            check_prefix_reuse(rt, greedy(spec_type="mtp", draft_n_max=3, n_predict=10), sleep)
    assert 0.2 < acc < 0.95
    # head 0's first drafts equal a one-batch reference pass of head 0 over the whole sequence:
    # the per-head catch-up (seq_rm + re-decode under each head) leaves head 0's KV intact
    seq = prompt + ref
    head0 = _head_logits(path, seq)
    top2 = np.sort(head0, axis=1)[:, -2:]
    checked = 0
    for pos, d1 in firsts:
        if pos < len(seq):
            checked += 1
            if int(head0[pos].argmax()) != d1:
                assert top2[pos, 1] - top2[pos, 0] < TIE_EPS, f"chained first draft at pos {pos}"
    assert checked > 10


def test_draft_model_with_another_vocabulary(models, tmp_path):
    s = models("glm4moe")
    orig = factory.tiny_vocab

    def other_vocab():
        toks, scores, types = orig()
        toks = list(toks)
        toks[-1] = "\u2581zzz"
        return toks, scores, types

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(factory, "tiny_vocab", other_vocab)
        other = tiny_model_set(tmp_path / "other", "glm4moe", "structured", "f32")
    with pytest.raises(VocabMismatchError) as e:
        Runtime.load(s["trunk"], spec_type="draft", draft_model=other["trunk"])
    assert "vocabulary" in _one_line(e) and "zzz" in str(e.value)
    with pytest.raises(VocabMismatchError):
        Runtime.load(s["trunk"], spec_type="mtp", draft_model=other["sidecar"])


# ---------------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------------


def test_registry_one_module_per_spec_type():
    """Every module of mtp_cli.drafters but the shared ones declares exactly one spec type; aliases resolve."""
    import pkgutil

    from mtp_cli import drafters
    from mtp_cli.config import GenConfig
    from mtp_cli.drafters.ngram import NgramDrafter
    from mtp_cli.errors import ConfigError

    # (base: the interface; rows: the row queue of those with a context; chain, joint: how drafters run
    # together; head_files, recall: the mtp spec's file checks and the prompt rows its heads re-read)
    shared = {"base", "rows", "chain", "joint", "head_files", "recall"}
    modules = {m.name for m in pkgutil.iter_modules(drafters.__path__)} - shared
    assert sorted(cls.__module__.rsplit(".", 1)[1] for cls in drafters.REGISTRY.values()) == sorted(modules)
    assert list(drafters.REGISTRY) == ["none", "mtp", "draft", "ngram", "lookup"]  # their order on the command line
    assert drafters.get("draft-mtp") is MtpDrafter and drafters.get(" NGRAM-simple ") is NgramDrafter
    assert set(drafters.names()) >= {"none", "mtp", "draft-mtp", "draft", "draft-simple", "ngram", "ngram-simple"}
    with pytest.raises(
        ConfigError, match="unknown spec type 'medusa'; use one of: none, mtp, draft, ngram, lookup, or several"
    ):
        drafters.get("medusa")
    cfg = drafters.validated(GenConfig(spec_type="draft-mtp", draft_n_max=2))
    assert cfg.spec_type == "mtp"
    with pytest.raises(ConfigError, match="ngram_min"):  # the drafter checks the settings only it reads
        drafters.validated(GenConfig(spec_type="ngram", ngram_min=3, ngram_max=2))
    assert drafters.validated(GenConfig(spec_type="mtp", ngram_min=3, ngram_max=2)).spec_type == "mtp"


# -- issue 29: every draft position is fed the right hidden state ---------------------------------


@contextlib.contextmanager
def _target_and_head(path: Path, seq: list[int]):
    """The model with its head, a target context that decoded `seq` in one batch, an MTP context on
    it: yields (model, the MTP context, the target's h rows of seq)."""
    m = lx.load_model(path, load_mtp=True)
    tgt = lx.create_context(m, n_ctx=256, n_batch=128, n_threads=THREADS, n_rs_seq=1)
    dft = lx.create_context(m, n_ctx=256, n_batch=128, n_threads=THREADS, ctx_type=lx.CTX_TYPE_MTP, ctx_other=tgt)
    try:
        lx.set_embeddings_nextn(tgt, True, False)
        lx.set_embeddings_nextn(dft, True, True)
        b = lx.Batch(len(seq))
        b.add_many(seq, 0)
        lx.decode(tgt, b)
        yield m, dft, lx.get_embeddings_nextn(tgt, len(seq))
    finally:
        dft.close()
        tgt.close()
        m.close()


def _head_logits(path: Path, seq: list[int]) -> np.ndarray:
    """Head 0's logits at every position of `seq`, fed as ARCHITECTURE §3 pairs them, in one batch."""
    with _target_and_head(path, seq) as (m, dft, h):
        E, V = lx.n_embd_out(m), lx.n_vocab(m)
        hb = lx.Batch(len(seq), E)
        for p, tok in enumerate(seq):
            hb.add(tok, p, logits=True, h=h[p - 1] if p else np.zeros(E, np.float32))
        lx.set_nextn_layer_offset(dft, 0)
        lx.decode(dft, hb)
        return lx.logits_rows(dft, len(seq), V).copy()


def _recorded_steps(rt: Runtime, prompt: list[int], n: int) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
    """The final sequence and each step's (pos, id_last, drafts), from a greedy run at N = n."""
    steps: list[tuple[int, int, list[int]]] = []
    orig = MtpDrafter.drafting

    def spy(self, id_last, pos, n_max):
        out = yield from orig(self, id_last, pos, n_max)
        steps.append((pos, id_last, list(out)))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MtpDrafter, "drafting", spy)
        out = run(rt, prompt, greedy(spec_type="mtp", draft_n_max=n, n_predict=60))
    return prompt + out, steps


def _reference_drafts(path: Path, seq: list[int], steps, chain: bool) -> list[list[tuple[int, float]]]:
    """llama.cpp's order, one row per decode: the head's memory holds (x_p, target h of p-1) for
    every p before the step; draft i+1 is read from the row (d_i, pos+i, the head's OWN h of the row
    before). Chained heads: draft i by head i over [id_last, d1..d_i], each row decoded alone.
    Returns each step's (reference token, top-2 logit gap) per position, continuing with the
    drafter's own tokens so that one tie does not shift the rest."""
    out: list[list[tuple[int, float]]] = []
    with _target_and_head(path, seq) as (m, dft, h_t):
        E, V = lx.n_embd_out(m), lx.n_vocab(m)
        n_heads = lx.n_layer_nextn(m)
        one = lx.Batch(1, E)

        def row(tok: int, p: int, h: np.ndarray, head: int = 0) -> tuple[int, float, np.ndarray]:
            lx.set_nextn_layer_offset(dft, head)
            one.clear()
            one.add(tok, p, logits=True, h=h)
            lx.decode(dft, one)
            logits = lx.logits_rows(dft, 1, V)[0]
            top2 = np.sort(logits)[-2:]
            return int(logits.argmax()), float(top2[1] - top2[0]), lx.get_embeddings_nextn_ith(dft, 0)

        zero = np.zeros(E, np.float32)
        filled = 0
        for pos, id_last, drafts in steps:
            while filled < pos:  # the head(s)' memory: the sequence so far
                for head in range(n_heads if chain else 1):  # (cells are shared: each head re-decodes its own)
                    lx.memory_seq_rm(dft, 0, filled, -1)
                    row(seq[filled], filled, h_t[filled - 1] if filled else zero, head)
                filled += 1
            got: list[tuple[int, float]] = []
            if chain:
                hs = [h_t[pos - 1]]
                for i in range(len(drafts)):
                    toks = [id_last, *drafts[:i]]
                    lx.memory_seq_rm(dft, 0, pos, -1)
                    for j, tok in enumerate(toks):
                        ref, gap, h = row(tok, pos + j, hs[j], head=i)
                    got.append((ref, gap))
                    hs.append(h)
                    lx.memory_seq_rm(dft, 0, pos, -1)
            else:
                tok, h = id_last, h_t[pos - 1]
                for i in range(len(drafts)):
                    ref, gap, h = row(tok, pos + i, h)
                    got.append((ref, gap))
                    tok = drafts[i]
                lx.memory_seq_rm(dft, 0, pos, -1)
            out.append(got)
        lx.set_nextn_layer_offset(dft, 0)
    return out


def _check_against_reference(path: Path, rt: Runtime, prompt: list[int], n: int, chain: bool) -> int:
    """Every draft (past a near-tie, the rest of that step is not compared) equals the reference;
    returns how many drafts at positions 2.. were compared."""
    seq, steps = _recorded_steps(rt, prompt, n)
    refs = _reference_drafts(path, seq, steps, chain)
    later = 0
    for (pos, _, drafts), ref in zip(steps, refs):
        for i, (d, (r, gap)) in enumerate(zip(drafts, ref)):
            if gap < TIE_EPS:
                break
            assert d == r, f"N={n}, step at {pos}: draft {i + 1} is {d}, the reference {r} (gap {gap:.3f})"
            later += i >= 1
    return later


def _as_recorded(arch: str, known: bool):
    """The arch's record as the table has it, or with its graph's h order unknown (every row of a
    merged decode an output: the fallback)."""
    from dataclasses import replace

    from gguf_tools import archs

    rec = archs.record(arch)
    assert rec is not None and rec.nextn_h is not None
    return contextlib.nullcontext() if known else archs.registered(replace(rec, nextn_h=None))


@pytest.mark.parametrize("known", [True, False], ids=["by-record", "every-row-an-output"])
@pytest.mark.parametrize("arch", ARCHS)
def test_later_drafts_read_their_own_rows_hidden_state(models, arch, known):
    """Drafts at positions 2.. after an accepted step (catch-up rows and the draft row in one
    decode) equal one-row-decode references: the head is fed the draft row's own h, not the first
    catch-up row's (which llama.cpp's masked extraction returned while only the draft row was an
    output)."""
    s = models(arch, head_noise=1.0, **SENSITIVE)
    with _as_recorded(arch, known), Runtime.load(s["full"], spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        later = sum(_check_against_reference(s["full"], rt, prompt, n, chain=False) for n in (1, 2, 3, 4))
        assert rt._ctx is not None and rt._ctx.drafters["mtp", 0].all_outputs is not known  # type: ignore[attr-defined]
    assert later > 20


@pytest.mark.parametrize("known", [True, False], ids=["by-record", "every-row-an-output"])
def test_chained_heads_later_drafts_match_the_reference(tmp_path, known):
    path = write_tiny_mimo2(tmp_path / "mimo2-3heads.gguf", n_heads=3, mix=2.0, head_noise=1.0)
    with _as_recorded("mimo2", known), Runtime.load(path, spec_type="mtp") as rt:
        prompt = rt.tokenize(PROMPT)
        later = sum(_check_against_reference(path, rt, prompt, n, chain=True) for n in (2, 3, 4))
    assert later > 10
