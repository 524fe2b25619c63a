"""Tiny-model factory: the GGUFs load in llama.cpp, decode, and run MTP (full and sidecar)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from tests.factory import (
    ARCHS,
    BOS_ID,
    DTYPES,
    N_VOCAB,
    TinySpec,
    tiny_model_set,
    token_permutation,
    write_tiny_model,
)
from tests.support import THREADS, Pair


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    lx.quiet_logs()
    yield


@pytest.fixture(scope="module")
def model_set(tmp_path_factory):
    """model_set(arch, weights, dtype, **overrides) -> {"full", "trunk", "sidecar"} paths, cached."""
    root = tmp_path_factory.mktemp("tiny")
    cache: dict[tuple, dict[str, Path]] = {}

    def get(arch: str, weights: str = "random", dtype: str = "f32", **kw) -> dict[str, Path]:
        key = (arch, weights, dtype, tuple(sorted(kw.items())))
        if key not in cache:
            d = root / f"set{len(cache)}"
            cache[key] = tiny_model_set(d, arch, weights, dtype, **kw)  # type: ignore[arg-type]
        return cache[key]

    return get


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------


def test_spec_validation(tmp_path):
    with pytest.raises(ValueError, match="recurrent"):
        write_tiny_model(tmp_path / "x.gguf", TinySpec(arch="qwen35", full_attention_interval=1))
    with pytest.raises(ValueError, match="recurrent"):
        write_tiny_model(tmp_path / "x.gguf", TinySpec(arch="qwen35", n_trunk_layers=1))
    with pytest.raises(ValueError, match="q8_0"):
        write_tiny_model(tmp_path / "x.gguf", TinySpec(dtype="q8_0", n_ff=48))
    with pytest.raises(ValueError, match="untied"):
        write_tiny_model(tmp_path / "x.gguf", TinySpec(weights="structured", tied_output=True))


def _read(path: Path) -> tuple[dict[str, object], dict[str, gguf.ReaderTensor]]:
    r = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return fields, {t.name: t for t in r.tensors}


@pytest.mark.parametrize("arch", ARCHS)
def test_layout_of_full_trunk_sidecar(model_set, arch):
    s = model_set(arch, "random", "q8_0")
    (ff, ft), (tf, tt), (sf, st) = _read(s["full"]), _read(s["trunk"]), _read(s["sidecar"])
    n_trunk = TinySpec().n_trunk_layers
    head = {n for n in ft if n.startswith(f"blk.{n_trunk}.")}
    shared = {"token_embd.weight", "output_norm.weight", "output.weight"}

    assert ff[f"{arch}.block_count"] == n_trunk + 1 and ff[f"{arch}.nextn_predict_layers"] == 1
    assert tf[f"{arch}.block_count"] == n_trunk and f"{arch}.nextn_predict_layers" not in tf
    assert sf[f"{arch}.block_count"] == n_trunk + 1 and sf[f"{arch}.nextn_predict_layers"] == 1
    assert {"nextn.eh_proj", "nextn.enorm", "nextn.hnorm"} <= {n.split(".", 2)[2].rsplit(".", 1)[0] for n in head}
    assert set(tt) == set(ft) - head
    assert set(st) == head | shared
    assert "blk.0.attn_norm.weight" not in st  # how llama.cpp recognises an MTP-only file
    for name, t in ft.items():  # the same bytes in every file that holds the tensor
        for other in (tt, st):
            if name in other:
                assert np.array_equal(np.asarray(t.data), np.asarray(other[name].data)), name
        if len(t.shape) == 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight")):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, name
    if arch == "qwen35":
        assert "blk.0.ssm_conv1d.weight" in ft and "blk.1.attn_q.weight" in ft  # recurrent + attention
    else:
        assert ff["glm4moe.leading_dense_block_count"] == n_trunk
        assert ff["glm4moe.expert_weights_norm"] is True
        assert not np.asarray(ft[f"blk.{n_trunk}.ffn_gate_inp.weight"].data).any()
        assert not np.asarray(ft[f"blk.{n_trunk}.ffn_down_shexp.weight"].data).any()


def test_structured_output_is_permuted_embedding(tmp_path):
    spec = TinySpec(weights="structured")
    _, t = _read(write_tiny_model(tmp_path / "s.gguf", spec))
    emb, out = np.asarray(t["token_embd.weight"].data), np.asarray(t["output.weight"].data)
    perm = token_permutation(spec)
    src = np.nonzero(perm >= 0)[0]
    assert np.array_equal(out[perm[src]], emb[src])
    assert sorted(perm[src]) == sorted(src)  # a permutation of the ordinary tokens
    assert not (perm[src] == src).any()


# ---------------------------------------------------------------------------------------------
# llama.cpp
# ---------------------------------------------------------------------------------------------


def test_tokenizer_roundtrip(model_set):
    m = lx.load_model(model_set("qwen35")["trunk"])
    try:
        assert lx.n_vocab(m) == N_VOCAB
        text = "hello world the a cat"
        toks = lx.tokenize(m, text)
        assert toks[0] == BOS_ID and len(toks) < len(text)  # word pieces, not only bytes
        # llama.cpp keeps SentencePiece's leading space when the first token is BOS
        assert lx.detokenize(m, toks) == " " + text
        assert lx.detokenize(m, toks[1:]) == text
        odd = "Hi! 42, {x}\ttab"
        assert lx.detokenize(m, lx.tokenize(m, odd)[1:]) == odd  # byte fallback
    finally:
        m.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("weights", ["random", "structured"])
@pytest.mark.parametrize("kind", ["full", "trunk"])
def test_target_loads_and_decodes(model_set, arch, dtype, weights, kind):
    m = lx.load_model(model_set(arch, weights, dtype)[kind])
    ctx = lx.create_context(m, n_ctx=128, n_batch=32, n_threads=THREADS)
    try:
        toks = lx.tokenize(m, "hello world the cat")
        b = lx.Batch(32)
        for i, t in enumerate(toks):
            b.add(t, i, logits=i == len(toks) - 1)
        lx.decode(ctx, b)
        logits = lx.logits_ith(ctx, len(toks) - 1)
        assert logits.shape == (N_VOCAB,) and np.isfinite(logits).all()
        b.clear()
        b.add(int(np.argmax(logits)), len(toks), logits=True)  # one more single-token step
        lx.decode(ctx, b)
        assert np.isfinite(lx.logits_ith(ctx, 0)).all()
        if weights == "structured":
            perm = token_permutation(TinySpec(arch=arch))
            assert int(np.argmax(logits)) == perm[toks[-1]]
    finally:
        ctx.close()
        m.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_context_decodes(model_set, arch, dtype):
    s = model_set(arch, "random", dtype)
    pair = Pair(s["full"], arch=arch)
    try:
        assert lx.n_layer_nextn(pair.tm) == 1
        assert not lx.reads_memory_of(pair.dft, pair.tgt)  # kept only by memory-sharing archs (gemma4)
        if arch == "qwen35":
            assert lx.n_rs_seq(pair.tgt) == 4
        toks = lx.tokenize(pair.tm, "hello world the cat")
        n = len(toks)
        logits, h = pair.target_all(toks)
        assert h.shape == (n, pair.E) and np.isfinite(h).all()
        head = pair.mtp_prefill(toks, h)
        assert np.isfinite(head).all()
        # two draft steps: (id_last, pos n, pending h = target row n-1), then the draft's own h row
        lx.set_nextn_layer_offset(pair.dft, 0)
        b = lx.Batch(4, pair.E)
        tok, hrow = int(np.argmax(logits[-1])), h[-1]
        for step in range(2):
            b.clear()
            b.add(tok, n + step, logits=True, h=hrow)
            lx.decode(pair.dft, b)
            lg = lx.logits_ith(pair.dft, 0)
            hrow = lx.get_embeddings_nextn_ith(pair.dft, 0)
            assert np.isfinite(lg).all() and np.isfinite(hrow).all() and hrow.shape == (pair.E,)
            tok = int(np.argmax(lg))
    finally:
        pair.close()


@pytest.mark.parametrize("options", [{}, {"tied_output": True, "head_optional": True}], ids=["plain", "tied+extras"])
@pytest.mark.parametrize("arch", ARCHS)
def test_sidecar_with_trunk_equals_full(model_set, arch, options):
    """trunk (target, no heads) + sidecar (-md, load_mtp) gives the full model's logits exactly."""
    s = model_set(arch, "random", "q8_0", **options)
    _, st = _read(s["sidecar"])
    assert ("output.weight" in st) != options.get("tied_output", False)
    full = Pair(s["full"], arch=arch)
    try:
        toks = lx.tokenize(full.tm, "hello world the a cat the world")
        tl_full, h_full = full.target_all(toks)
        hl_full = full.mtp_prefill(toks, h_full)
    finally:
        full.close()
    packed = Pair(s["trunk"], s["sidecar"], arch=arch)
    try:
        info = packed.dm.info
        assert info.mtp_only and info.load_mtp
        tl, h = packed.target_all(toks)
        hl = packed.mtp_prefill(toks, h)
    finally:
        packed.close()
    np.testing.assert_array_equal(tl, tl_full)
    np.testing.assert_array_equal(h, h_full)
    np.testing.assert_array_equal(hl, hl_full)


def test_refusals_instead_of_llama_cpp_aborts(model_set):
    s = model_set("qwen35")
    trunk = lx.load_model(s["trunk"], load_mtp=True)
    full_no_mtp = lx.load_model(s["full"], load_mtp=False)
    side = lx.load_model(s["sidecar"], load_mtp=True)
    try:
        tgt = lx.create_context(trunk, n_ctx=128, n_batch=64)
        with pytest.raises(lx.LlamaError, match="MTP head"):
            lx.create_context(trunk, n_ctx=64, ctx_type=lx.CTX_TYPE_MTP, ctx_other=tgt)
        with pytest.raises(lx.LlamaError, match="load_mtp"):  # llama.cpp would GGML_ASSERT
            lx.create_context(full_no_mtp, n_ctx=64, ctx_type=lx.CTX_TYPE_MTP, ctx_other=tgt)
        with pytest.raises(lx.LlamaError, match="MTP context"):  # llama.cpp would segfault
            lx.create_context(side, n_ctx=64)
        with pytest.raises(lx.LlamaError, match="load_mtp=True"):
            lx.load_model(s["sidecar"], load_mtp=False)
        b = lx.Batch(80)
        for i in range(80):
            b.add(5, i)
        with pytest.raises(lx.LlamaError, match="n_batch"):  # llama.cpp would GGML_ASSERT
            lx.decode(tgt, b)
        with pytest.raises(lx.LlamaError, match="no such file"):
            lx.load_model(s["full"].with_suffix(".missing"))
        tgt.close()
    finally:
        for m in (trunk, full_no_mtp, side):
            m.close()


def _acceptance(pair: Pair, n_gen: int = 48) -> float:
    """Share of positions where the head's argmax equals the target's next greedy token."""
    prompt = lx.tokenize(pair.tm, "hello world")
    seq = pair.greedy(prompt, n_gen)
    logits, h = pair.target_all(seq)
    head = pair.mtp_prefill(seq, h)
    lx.memory_clear(pair.tgt)
    lx.memory_clear(pair.dft)
    target_next = logits.argmax(axis=1)
    return float((head.argmax(axis=1) == target_next)[len(prompt) :].mean())


@pytest.mark.parametrize("arch", ARCHS)
def test_structured_head_acceptance(model_set, arch, record_property):
    rates = {}
    for noise in (0.0, 1.5):
        s = model_set(arch, "structured", "q8_0", head_noise=noise)
        pair = Pair(s["full"], arch=arch)
        try:
            seq = pair.greedy(lx.tokenize(pair.tm, "hello"), 8)
            perm = token_permutation(TinySpec(arch=arch))
            assert all(seq[i + 1] == perm[seq[i]] for i in range(1, len(seq) - 1))  # greedy = P
            rates[noise] = _acceptance(pair)
        finally:
            pair.close()
    record_property("acceptance", rates)
    print(f"\n{arch}: head argmax == target next greedy: {rates}")
    assert rates[0.0] > 0.9
    assert 0.0 < rates[1.5] < rates[0.0]


def test_tiny_model_set_replace_kind_consistent(tmp_path):
    """write_tiny_model with kind=full equals tiny_model_set's full (deterministic per seed)."""
    a = tiny_model_set(tmp_path / "a", "glm4moe", "structured", "f16", seed=3)["full"]
    b = write_tiny_model(
        tmp_path / "b.gguf", replace(TinySpec(arch="glm4moe", weights="structured", dtype="f16", seed=3), kind="full")
    )
    assert a.read_bytes() == b.read_bytes()
    c = tiny_model_set(tmp_path / "c", "glm4moe", "structured", "f16", seed=4)["full"]
    assert a.read_bytes() != c.read_bytes()
