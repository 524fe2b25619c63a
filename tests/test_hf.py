"""gguf_tools.hf_heads: MTP heads from fake HF safetensors checkpoints (tiny dims, no network).

Expected GGUF shapes are the `create_tensor` ne lists of llama.cpp's loaders (vendored in
llama-cpp-python 0.3.36): src/models/qwen35.cpp load_block_mtp (l.93-116), qwen35moe.cpp load_block_mtp,
glm4-moe.cpp (l.55-121), deepseek2.cpp (l.94-159). A numpy shape is the reversed ne; trailing ne of 1
match a shorter ne list, as in llama_model_loader::check_tensor_dims.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors import serialize_file

try:
    from safetensors import TensorSpec
except ImportError:  # safetensors < 0.8
    TensorSpec = None

from gguf_tools import hf as hf_heads
from gguf_tools.errors import BadFileError, MismatchError
from gguf_tools.hf import find_safetensors, is_safetensors_source, read_hf_heads
from gguf_tools.hf.files import Catalog

H, V = 64, 300  # n_embd, n_vocab
NH, NKV, HD = 4, 2, 16  # heads, kv heads, head dim
FF, E, FFE, FFSH = 128, 4, 32, 48
N_TRUNK = 2

_rng = np.random.default_rng(0)


def rnd(*shape: int) -> np.ndarray:
    """Values exact in bf16 and f16 (k/8, |k| < 64)."""
    return (_rng.integers(-63, 64, size=shape) / 8).astype(np.float32)


def save(path: Path, tensors: dict[str, np.ndarray], bf16: bool | set[str] = False) -> Path:
    """Write through safetensors' raw API so bf16 needs no torch."""
    specs, keep = {}, []
    for name, a in tensors.items():
        if bf16 is True or (isinstance(bf16, set) and name in bf16):
            raw = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
            dtype = "bfloat16"
        else:
            raw = np.ascontiguousarray(a)
            dtype = str(raw.dtype)
        keep.append(raw)
        specs[name] = spec(dtype, a.shape, raw)
    serialize_file(specs, str(path), {"format": "pt"})
    return path


def spec(dtype: str, shape, raw: np.ndarray):
    if TensorSpec is None:  # safetensors < 0.8 takes plain dicts
        return {"dtype": dtype, "shape": list(shape), "data": raw.tobytes()}
    return TensorSpec(dtype=dtype, shape=list(shape), data_ptr=raw.ctypes.data, data_len=raw.nbytes)


def ne_ok(shape: tuple[int, ...], ne: tuple[int, ...]) -> bool:
    got = tuple(reversed(shape))
    return got[: len(ne)] == ne and all(d == 1 for d in got[len(ne) :])


def by_name(heads) -> dict[str, np.ndarray]:
    names = [h.name for h in heads]
    assert len(names) == len(set(names))
    return {h.name: h.data for h in heads}


# ---------------------------------------------------------------------------------------------- checkpoints


def qwen_trunk(prefix: str = "model.language_model.") -> dict[str, np.ndarray]:
    return {
        f"{prefix}embed_tokens.weight": rnd(V, H),
        f"{prefix}norm.weight": rnd(H),
        f"{prefix}layers.0.input_layernorm.weight": rnd(H),
        f"{prefix}layers.1.self_attn.q_proj.weight": rnd(2 * NH * HD, H),
        "lm_head.weight": rnd(V, H),
    }


def qwen_mtp(moe: str | None = None, mtp: str = "mtp.") -> dict[str, np.ndarray]:
    t = {
        f"{mtp}fc.weight": rnd(H, 2 * H),
        f"{mtp}pre_fc_norm_embedding.weight": rnd(H),
        f"{mtp}pre_fc_norm_hidden.weight": rnd(H),
        f"{mtp}norm.weight": rnd(H),
    }
    p = f"{mtp}layers.0."
    t.update(
        {
            p + "input_layernorm.weight": rnd(H),
            p + "post_attention_layernorm.weight": rnd(H),
            p + "self_attn.q_proj.weight": rnd(2 * NH * HD, H),  # q and gate together
            p + "self_attn.k_proj.weight": rnd(NKV * HD, H),
            p + "self_attn.v_proj.weight": rnd(NKV * HD, H),
            p + "self_attn.o_proj.weight": rnd(H, NH * HD),
            p + "self_attn.q_norm.weight": rnd(HD),
            p + "self_attn.k_norm.weight": rnd(HD),
        }
    )
    if moe is None:
        t.update(
            {
                p + "mlp.gate_proj.weight": rnd(FF, H),
                p + "mlp.up_proj.weight": rnd(FF, H),
                p + "mlp.down_proj.weight": rnd(H, FF),
            }
        )
        return t
    t.update(
        {
            p + "mlp.gate.weight": rnd(E, H),
            p + "mlp.shared_expert.gate_proj.weight": rnd(FFSH, H),
            p + "mlp.shared_expert.up_proj.weight": rnd(FFSH, H),
            p + "mlp.shared_expert.down_proj.weight": rnd(H, FFSH),
            p + "mlp.shared_expert_gate.weight": rnd(1, H),
        }
    )
    for x in range(E):
        t[p + f"mlp.experts.{x}.gate_proj.weight"] = rnd(FFE, H)
        t[p + f"mlp.experts.{x}.up_proj.weight"] = rnd(FFE, H)
        t[p + f"mlp.experts.{x}.down_proj.weight"] = rnd(H, FFE)
    if moe == "fused":
        # transformers-v5 layout: gate_up [E, 2*ff, H] (gate first), down [E, H, ff]
        gate = np.stack([t.pop(p + f"mlp.experts.{x}.gate_proj.weight") for x in range(E)])
        up = np.stack([t.pop(p + f"mlp.experts.{x}.up_proj.weight") for x in range(E)])
        down = np.stack([t.pop(p + f"mlp.experts.{x}.down_proj.weight") for x in range(E)])
        t[p + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        t[p + "mlp.experts.down_proj"] = down
    return t


B = N_TRUNK  # head block index

QWEN_ATTN_NE = {
    f"blk.{B}.nextn.eh_proj.weight": (2 * H, H),
    f"blk.{B}.nextn.enorm.weight": (H,),
    f"blk.{B}.nextn.hnorm.weight": (H,),
    f"blk.{B}.nextn.shared_head_norm.weight": (H,),
    f"blk.{B}.attn_norm.weight": (H,),
    f"blk.{B}.post_attention_norm.weight": (H,),
    f"blk.{B}.attn_q.weight": (H, NH * HD * 2),
    f"blk.{B}.attn_k.weight": (H, NKV * HD),
    f"blk.{B}.attn_v.weight": (H, NKV * HD),
    f"blk.{B}.attn_output.weight": (NH * HD, H),
    f"blk.{B}.attn_q_norm.weight": (HD,),
    f"blk.{B}.attn_k_norm.weight": (HD,),
}
QWEN_DENSE_NE = {
    **QWEN_ATTN_NE,
    f"blk.{B}.ffn_gate.weight": (H, FF),
    f"blk.{B}.ffn_up.weight": (H, FF),
    f"blk.{B}.ffn_down.weight": (FF, H),
}
QWEN_MOE_NE = {
    **QWEN_ATTN_NE,
    f"blk.{B}.ffn_gate_inp.weight": (H, E),
    f"blk.{B}.ffn_down_exps.weight": (FFE, H, E),
    f"blk.{B}.ffn_gate_exps.weight": (H, FFE, E),
    f"blk.{B}.ffn_up_exps.weight": (H, FFE, E),
    f"blk.{B}.ffn_gate_inp_shexp.weight": (H,),
    f"blk.{B}.ffn_gate_shexp.weight": (H, FFSH),
    f"blk.{B}.ffn_up_shexp.weight": (H, FFSH),
    f"blk.{B}.ffn_down_shexp.weight": (FFSH, H),
}

# HF name (relative to mtp.) -> GGUF name, and whether the converter adds 1 (qwen.py:401-402)
QWEN_PAIRS = [
    ("fc.weight", "nextn.eh_proj.weight", False),
    ("pre_fc_norm_embedding.weight", "nextn.enorm.weight", True),
    ("pre_fc_norm_hidden.weight", "nextn.hnorm.weight", True),
    ("norm.weight", "nextn.shared_head_norm.weight", True),
    ("layers.0.input_layernorm.weight", "attn_norm.weight", True),
    ("layers.0.post_attention_layernorm.weight", "post_attention_norm.weight", True),
    ("layers.0.self_attn.q_norm.weight", "attn_q_norm.weight", True),
    ("layers.0.self_attn.k_norm.weight", "attn_k_norm.weight", True),
    ("layers.0.self_attn.q_proj.weight", "attn_q.weight", False),
    ("layers.0.self_attn.o_proj.weight", "attn_output.weight", False),
]


def check_shapes(heads, expected_ne):
    got = by_name(heads)
    assert set(got) == set(expected_ne)
    for name, ne in expected_ne.items():
        assert ne_ok(got[name].shape, ne), (name, got[name].shape, ne)


# ---------------------------------------------------------------------------------------------- qwen


def test_qwen35_dense_names_shapes_norm_plus_one_and_trunk_not_read(tmp_path, monkeypatch):
    mtp = qwen_mtp()
    f = save(tmp_path / "model.safetensors", {**qwen_trunk(), **mtp})
    read = []
    real = Catalog.read
    monkeypatch.setattr(Catalog, "read", lambda cat, name: read.append(name) or real(cat, name))

    heads = read_hf_heads([f], "qwen35", N_TRUNK)
    check_shapes(heads, QWEN_DENSE_NE)
    got = by_name(heads)
    for hf, gg, plus in QWEN_PAIRS:
        np.testing.assert_array_equal(got[f"blk.{B}.{gg}"], mtp["mtp." + hf] + (1 if plus else 0), err_msg=hf)
    assert all(d.dtype == np.float32 for d in got.values())
    assert sorted(read) == sorted(mtp)  # only MTP tensors were read
    assert [h.name for h in heads] == sorted(h.name for h in heads)


def test_qwen35_bf16_and_f16(tmp_path):
    mtp = qwen_mtp()
    f16 = {"mtp.layers.0.self_attn.k_norm.weight", "mtp.layers.0.self_attn.v_proj.weight"}
    tensors = {k: (v.astype(np.float16) if k in f16 else v) for k, v in mtp.items()}
    f = save(tmp_path / "m.safetensors", {**qwen_trunk(), **tensors}, bf16=set(mtp) - f16)
    got = by_name(read_hf_heads([f], "qwen35", N_TRUNK))
    for hf, gg, plus in QWEN_PAIRS:
        if "k_norm" in hf:
            continue
        a = got[f"blk.{B}.{gg}"]
        assert a.dtype == np.float32  # bf16 -> f32 before +1, as base.py:1064
        np.testing.assert_array_equal(a, mtp["mtp." + hf] + (1 if plus else 0))
    k_norm = got[f"blk.{B}.attn_k_norm.weight"]
    assert k_norm.dtype == np.float16  # f16 kept, +1 in f16
    np.testing.assert_array_equal(k_norm, (mtp["mtp.layers.0.self_attn.k_norm.weight"] + 1).astype(np.float16))
    assert got[f"blk.{B}.attn_v.weight"].dtype == np.float16


def test_qwen35moe_per_expert_stacking(tmp_path):
    mtp = qwen_mtp(moe="experts")
    f = save(tmp_path / "m.safetensors", {**qwen_trunk(), **mtp}, bf16=True)
    heads = read_hf_heads([f], "qwen35moe", N_TRUNK, n_nextn=1)
    check_shapes(heads, QWEN_MOE_NE)
    got = by_name(heads)
    p = "mtp.layers.0.mlp."
    for w, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
        for x in range(E):
            np.testing.assert_array_equal(got[f"blk.{B}.{gg}.weight"][x], mtp[p + f"experts.{x}.{w}.weight"])
    np.testing.assert_array_equal(got[f"blk.{B}.ffn_gate_inp_shexp.weight"], mtp[p + "shared_expert_gate.weight"])
    assert got[f"blk.{B}.ffn_gate_inp_shexp.weight"].shape == (1, H)  # kept [1, n_embd], as the converter does
    np.testing.assert_array_equal(got[f"blk.{B}.ffn_gate_inp.weight"], mtp[p + "gate.weight"])


def test_qwen35moe_fused_experts_equal_per_expert(tmp_path):
    _rng_state = _rng.bit_generator.state
    per = qwen_mtp(moe="experts")
    _rng.bit_generator.state = _rng_state
    fused = qwen_mtp(moe="fused")
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in fused
    a = by_name(read_hf_heads([save(tmp_path / "a.safetensors", per)], "qwen35moe", N_TRUNK))
    b = by_name(read_hf_heads([save(tmp_path / "b.safetensors", fused)], "qwen35moe", N_TRUNK))
    assert set(a) == set(b) == set(QWEN_MOE_NE)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        assert b[name].flags.c_contiguous


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
@pytest.mark.parametrize("mtp_prefix", ["model.mtp.", "model.language_model.mtp."])
def test_qwen_prefix_variants(tmp_path, arch, mtp_prefix):
    mtp = qwen_mtp(moe="experts", mtp=mtp_prefix)
    f = save(tmp_path / "m.safetensors", {**qwen_trunk("model."), **mtp})
    heads = read_hf_heads([f], arch, 40)
    names = {h.name for h in heads}
    assert names == {n.replace(f"blk.{B}.", "blk.40.") for n in QWEN_MOE_NE}


def test_qwen_several_files_without_index(tmp_path):
    mtp = qwen_mtp()
    keys = sorted(mtp)
    f1 = save(tmp_path / "one.safetensors", {k: mtp[k] for k in keys[::2]} | qwen_trunk())
    f2 = save(tmp_path / "two.safetensors", {k: mtp[k] for k in keys[1::2]})
    heads = read_hf_heads([f1, f2], "qwen35", N_TRUNK)
    check_shapes(heads, QWEN_DENSE_NE)
    assert find_safetensors(tmp_path) == [f1, f2]
    assert {h.name for h in read_hf_heads([tmp_path], "qwen35", N_TRUNK)} == set(QWEN_DENSE_NE)


def test_iter_hf_heads_is_lazy_and_matches(tmp_path):
    f = save(tmp_path / "m.safetensors", qwen_mtp())
    it = hf_heads.iter_hf_heads([f], "qwen35", N_TRUNK)
    first = next(it)
    assert first.name == sorted(QWEN_DENSE_NE)[0]
    assert [first.name] + [h.name for h in it] == [h.name for h in read_hf_heads([f], "qwen35", N_TRUNK)]


# ---------------------------------------------------------------------------------------------- glm4moe


def glm_layer(i: int, nextn: bool) -> dict[str, np.ndarray]:
    p = f"model.layers.{i}."
    t = {
        p + "input_layernorm.weight": rnd(H),
        p + "post_attention_layernorm.weight": rnd(H),
        p + "self_attn.q_proj.weight": rnd(NH * HD, H),
        p + "self_attn.q_proj.bias": rnd(NH * HD),
        p + "self_attn.k_proj.weight": rnd(NKV * HD, H),
        p + "self_attn.k_proj.bias": rnd(NKV * HD),
        p + "self_attn.v_proj.weight": rnd(NKV * HD, H),
        p + "self_attn.v_proj.bias": rnd(NKV * HD),
        p + "self_attn.o_proj.weight": rnd(H, NH * HD),
        p + "mlp.gate.weight": rnd(E, H),
        p + "mlp.gate.e_score_correction_bias": rnd(E),
        p + "mlp.shared_experts.gate_proj.weight": rnd(FFE, H),
        p + "mlp.shared_experts.up_proj.weight": rnd(FFE, H),
        p + "mlp.shared_experts.down_proj.weight": rnd(H, FFE),
    }
    for x in range(E):
        t[p + f"mlp.experts.{x}.gate_proj.weight"] = rnd(FFE, H)
        t[p + f"mlp.experts.{x}.up_proj.weight"] = rnd(FFE, H)
        t[p + f"mlp.experts.{x}.down_proj.weight"] = rnd(H, FFE)
    if nextn:
        t.update(
            {
                p + "eh_proj.weight": rnd(H, 2 * H),
                p + "enorm.weight": rnd(H),
                p + "hnorm.weight": rnd(H),
                p + "embed_tokens.weight": rnd(V, H),
                p + "shared_head.head.weight": rnd(V, H),
                p + "shared_head.norm.weight": rnd(H),
            }
        )
    return t


GLM_NE = {
    f"blk.{B}.attn_norm.weight": (H,),
    f"blk.{B}.post_attention_norm.weight": (H,),
    f"blk.{B}.attn_q.weight": (H, NH * HD),
    f"blk.{B}.attn_q.bias": (NH * HD,),
    f"blk.{B}.attn_k.weight": (H, NKV * HD),
    f"blk.{B}.attn_k.bias": (NKV * HD,),
    f"blk.{B}.attn_v.weight": (H, NKV * HD),
    f"blk.{B}.attn_v.bias": (NKV * HD,),
    f"blk.{B}.attn_output.weight": (NH * HD, H),
    f"blk.{B}.ffn_gate_inp.weight": (H, E),
    f"blk.{B}.exp_probs_b.bias": (E,),
    f"blk.{B}.ffn_gate_exps.weight": (H, FFE, E),
    f"blk.{B}.ffn_down_exps.weight": (FFE, H, E),
    f"blk.{B}.ffn_up_exps.weight": (H, FFE, E),
    f"blk.{B}.ffn_gate_shexp.weight": (H, FFE),
    f"blk.{B}.ffn_down_shexp.weight": (FFE, H),
    f"blk.{B}.ffn_up_shexp.weight": (H, FFE),
    f"blk.{B}.nextn.eh_proj.weight": (2 * H, H),
    f"blk.{B}.nextn.enorm.weight": (H,),
    f"blk.{B}.nextn.hnorm.weight": (H,),
    f"blk.{B}.nextn.embed_tokens.weight": (H, V),
    f"blk.{B}.nextn.shared_head_head.weight": (H, V),
    f"blk.{B}.nextn.shared_head_norm.weight": (H,),
}


def glm_checkpoint(tmp_path: Path, write_trunk_shard: bool) -> tuple[Path, dict, dict]:
    """3 shards + index: trunk / nextn attention+norms / nextn experts."""
    trunk = {
        "model.embed_tokens.weight": rnd(V, H),
        "model.norm.weight": rnd(H),
        "lm_head.weight": rnd(V, H),
        **glm_layer(0, False),
        **glm_layer(1, False),
    }
    head = glm_layer(N_TRUNK, True)
    experts = {k: v for k, v in head.items() if ".mlp.experts." in k}
    rest = {k: v for k, v in head.items() if k not in experts}
    d = tmp_path / "glm"
    d.mkdir()
    shards = {
        "model-00001-of-00003.safetensors": trunk,
        "model-00002-of-00003.safetensors": rest,
        "model-00003-of-00003.safetensors": experts,
    }
    for name, tensors in shards.items():
        if write_trunk_shard or tensors is not trunk:
            save(d / name, tensors, bf16=True)
    weight_map = {k: name for name, tensors in shards.items() for k in tensors}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d, head, trunk


def test_glm4moe_sharded_index_trunk_shard_absent(tmp_path):
    d, head, _ = glm_checkpoint(tmp_path, write_trunk_shard=False)
    files = find_safetensors(d)
    assert [f.name for f in files] == ["model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    for source in ([d], files, [d / "model.safetensors.index.json"]):
        heads = read_hf_heads(source, "glm4moe", N_TRUNK, n_nextn=1)
        check_shapes(heads, GLM_NE)
    got = by_name(heads)
    p = f"model.layers.{B}."
    np.testing.assert_array_equal(got[f"blk.{B}.exp_probs_b.bias"], head[p + "mlp.gate.e_score_correction_bias"])
    np.testing.assert_array_equal(got[f"blk.{B}.nextn.enorm.weight"], head[p + "enorm.weight"])  # no +1 for GLM
    np.testing.assert_array_equal(got[f"blk.{B}.attn_norm.weight"], head[p + "input_layernorm.weight"])
    np.testing.assert_array_equal(got[f"blk.{B}.nextn.shared_head_head.weight"], head[p + "shared_head.head.weight"])
    for x in range(E):
        np.testing.assert_array_equal(
            got[f"blk.{B}.ffn_down_exps.weight"][x], head[p + f"mlp.experts.{x}.down_proj.weight"]
        )


def test_glm4moe_full_single_file_skips_trunk(tmp_path):
    d, head, trunk = glm_checkpoint(tmp_path, write_trunk_shard=True)
    f = save(tmp_path / "all.safetensors", {**trunk, **head})
    check_shapes(read_hf_heads([f], "glm4moe", N_TRUNK), GLM_NE)


def test_glm4moe_missing_mtp_shard(tmp_path):
    d, _, _ = glm_checkpoint(tmp_path, write_trunk_shard=False)
    (d / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(BadFileError, match="missing shard") as e:
        read_hf_heads([d], "glm4moe", N_TRUNK)
    assert e.value.path.name == "model-00003-of-00003.safetensors"


def test_glm4moe_wrong_trunk_size(tmp_path):
    d, _, _ = glm_checkpoint(tmp_path, write_trunk_shard=False)
    with pytest.raises(MismatchError, match=r"'model\.layers\.5\.'.*highest layer present: model\.layers\.2"):
        read_hf_heads([d], "glm4moe", 5)
    with pytest.raises(MismatchError, match="the trunk expects 2"):
        read_hf_heads([d], "glm4moe", N_TRUNK, n_nextn=2)
    # trunk of 1 block: layer 1 would be a head too, and its (trunk) shard is not on disk
    with pytest.raises(BadFileError, match="missing shard"):
        read_hf_heads([d], "glm4moe", 1)


def test_glm4moe_head_block_without_nextn_tensors(tmp_path):
    _, head, trunk = glm_checkpoint(tmp_path, write_trunk_shard=True)
    f = save(tmp_path / "all.safetensors", {**trunk, **head})
    # trunk of 1 block: layers 1 and 2 would both be heads, layer 1 lacks the nextn tensors
    with pytest.raises(MismatchError, match=r"incomplete MTP head: no tensor for blk\.1\.nextn\.eh_proj"):
        read_hf_heads([f], "glm4moe", 1)


# ---------------------------------------------------------------------------------------------- deepseek2

Q_LORA, KV_LORA, NOPE, ROPE, VD, NSH = 32, 16, 8, 4, 6, 1


def ds_layer(i: int) -> dict[str, np.ndarray]:
    p = f"model.layers.{i}."
    t = {
        p + "input_layernorm.weight": rnd(H),
        p + "post_attention_layernorm.weight": rnd(H),
        p + "self_attn.q_a_proj.weight": rnd(Q_LORA, H),
        p + "self_attn.q_a_layernorm.weight": rnd(Q_LORA),
        p + "self_attn.q_b_proj.weight": rnd(NH * (NOPE + ROPE), Q_LORA),
        p + "self_attn.kv_a_proj_with_mqa.weight": rnd(KV_LORA + ROPE, H),
        p + "self_attn.kv_a_layernorm.weight": rnd(KV_LORA),
        p + "self_attn.kv_b_proj.weight": rnd(NH * (NOPE + VD), KV_LORA),
        p + "self_attn.o_proj.weight": rnd(H, NH * VD),
        p + "mlp.gate.weight": rnd(E, H),
        p + "mlp.gate.e_score_correction_bias": rnd(E),
        p + "mlp.shared_experts.gate_proj.weight": rnd(FFE * NSH, H),
        p + "mlp.shared_experts.up_proj.weight": rnd(FFE * NSH, H),
        p + "mlp.shared_experts.down_proj.weight": rnd(H, FFE * NSH),
        p + "eh_proj.weight": rnd(H, 2 * H),
        p + "enorm.weight": rnd(H),
        p + "hnorm.weight": rnd(H),
        p + "shared_head.norm.weight": rnd(H),
    }
    for x in range(E):
        t[p + f"mlp.experts.{x}.gate_proj.weight"] = rnd(FFE, H)
        t[p + f"mlp.experts.{x}.up_proj.weight"] = rnd(FFE, H)
        t[p + f"mlp.experts.{x}.down_proj.weight"] = rnd(H, FFE)
    return t


DS_NE = {
    f"blk.{B}.attn_norm.weight": (H,),
    f"blk.{B}.attn_q_a_norm.weight": (Q_LORA,),
    f"blk.{B}.attn_kv_a_norm.weight": (KV_LORA,),
    f"blk.{B}.attn_q_a.weight": (H, Q_LORA),
    f"blk.{B}.attn_q_b.weight": (Q_LORA, NH * (NOPE + ROPE)),
    f"blk.{B}.attn_kv_a_mqa.weight": (H, KV_LORA + ROPE),
    f"blk.{B}.attn_k_b.weight": (NOPE, KV_LORA, NH),
    f"blk.{B}.attn_v_b.weight": (KV_LORA, VD, NH),
    f"blk.{B}.attn_output.weight": (NH * VD, H),
    f"blk.{B}.ffn_norm.weight": (H,),
    f"blk.{B}.ffn_gate_inp.weight": (H, E),
    f"blk.{B}.exp_probs_b.bias": (E,),
    f"blk.{B}.ffn_down_exps.weight": (FFE, H, E),
    f"blk.{B}.ffn_gate_exps.weight": (H, FFE, E),
    f"blk.{B}.ffn_up_exps.weight": (H, FFE, E),
    f"blk.{B}.ffn_gate_shexp.weight": (H, FFE * NSH),
    f"blk.{B}.ffn_down_shexp.weight": (FFE * NSH, H),
    f"blk.{B}.ffn_up_shexp.weight": (H, FFE * NSH),
    f"blk.{B}.nextn.eh_proj.weight": (2 * H, H),
    f"blk.{B}.nextn.enorm.weight": (H,),
    f"blk.{B}.nextn.hnorm.weight": (H,),
    f"blk.{B}.nextn.shared_head_norm.weight": (H,),
}


@pytest.mark.parametrize("config", [None, "good", "bad"])
def test_deepseek2_kv_b_split(tmp_path, config):
    head = ds_layer(N_TRUNK)
    f = save(tmp_path / "model.safetensors", {"model.embed_tokens.weight": rnd(V, H), **head})
    if config:
        cfg = {
            "num_attention_heads": NH,
            "num_key_value_heads": NH,
            "qk_nope_head_dim": NOPE,
            "v_head_dim": VD if config == "good" else VD + 2,
            "qk_rope_head_dim": ROPE,
        }
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    if config == "bad":
        with pytest.raises(MismatchError, match="config.json"):
            read_hf_heads([f], "deepseek2", N_TRUNK)
        return
    heads = read_hf_heads([f], "deepseek2", N_TRUNK)
    check_shapes(heads, DS_NE)
    got = by_name(heads)
    kv_b = head[f"model.layers.{B}.self_attn.kv_b_proj.weight"].reshape(NH, NOPE + VD, KV_LORA)
    for h in range(NH):  # deepseek.py:444-446
        np.testing.assert_array_equal(got[f"blk.{B}.attn_k_b.weight"][h], kv_b[h, :NOPE, :].T)
        np.testing.assert_array_equal(got[f"blk.{B}.attn_v_b.weight"][h], kv_b[h, NOPE:, :])
    assert got[f"blk.{B}.attn_k_b.weight"].flags.c_contiguous


# ---------------------------------------------------------------------------------------------- errors


def test_error_missing_path(tmp_path):
    with pytest.raises(BadFileError, match="no such file") as e:
        read_hf_heads([tmp_path / "nope.safetensors"], "qwen35", N_TRUNK)
    assert e.value.path == tmp_path / "nope.safetensors"


@pytest.mark.parametrize(
    "content, msg",
    [(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64, "GGUF"), (b"hello, world, not tensors at all", "not a safetensors")],
)
def test_error_not_safetensors(tmp_path, content, msg):
    f = tmp_path / "x.bin"
    f.write_bytes(content)
    assert not is_safetensors_source(f)
    with pytest.raises(BadFileError, match=msg) as e:
        read_hf_heads([f], "qwen35", N_TRUNK)
    assert e.value.path == f


@pytest.mark.parametrize("cut", [4, 100, 1000])
def test_error_truncated(tmp_path, cut):
    f = save(tmp_path / "m.safetensors", qwen_mtp())
    data = f.read_bytes()
    f.write_bytes(data[:-cut])  # header intact, data short: safetensors itself refuses to open it
    with pytest.raises(BadFileError, match="truncated or corrupt") as e:
        read_hf_heads([f], "qwen35", N_TRUNK)
    assert e.value.path == f and "\n" not in str(e.value)


def test_own_size_check_on_truncated_file(tmp_path, monkeypatch):
    """The explicit data-range check, independent of what the installed safetensors does on open."""
    f = save(tmp_path / "m.safetensors", qwen_mtp())
    size = f.stat().st_size
    cat = Catalog([f], contextlib.ExitStack())
    cat._check_size(f)  # intact: fine
    monkeypatch.setattr(Path, "stat", lambda self, **kw: os.stat_result((0,) * 6 + (size - 10,) + (0,) * 3))
    with pytest.raises(BadFileError, match=f"up to byte {size}, the file has {size - 10} bytes"):
        cat._check_size(f)


def test_error_truncated_header(tmp_path):
    f = save(tmp_path / "m.safetensors", qwen_mtp())
    f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(BadFileError):
        read_hf_heads([f], "qwen35", N_TRUNK)


def test_error_no_mtp_tensors(tmp_path):
    f = save(tmp_path / "m.safetensors", qwen_trunk())
    with pytest.raises(MismatchError, match=r"no MTP tensors for qwen35: expected names starting with 'mtp\.'") as e:
        read_hf_heads([f], "qwen35", N_TRUNK)
    assert e.value.path == f


def test_error_unsupported_arch(tmp_path):
    f = save(tmp_path / "m.safetensors", qwen_mtp())
    for arch in ("llama", "step35"):
        with pytest.raises(MismatchError, match=f"not supported for trunk arch '{arch}'"):
            read_hf_heads([f], arch, N_TRUNK)


def test_error_incomplete_experts(tmp_path):
    mtp = qwen_mtp(moe="experts")
    del mtp["mtp.layers.0.mlp.experts.2.up_proj.weight"]
    f = save(tmp_path / "m.safetensors", mtp)
    with pytest.raises(MismatchError, match=r"up_proj missing for expert\(s\) \[2\]"):
        read_hf_heads([f], "qwen35moe", N_TRUNK)


def test_error_missing_required_nextn(tmp_path):
    mtp = qwen_mtp()
    del mtp["mtp.fc.weight"]
    with pytest.raises(MismatchError, match=r"no tensor for blk\.2\.nextn\.eh_proj\.weight"):
        read_hf_heads([save(tmp_path / "m.safetensors", mtp)], "qwen35", N_TRUNK)


def test_error_unmappable_mtp_name(tmp_path):
    mtp = qwen_mtp()
    mtp["mtp.fc_hidden.weight"] = rnd(H, H)
    with pytest.raises(MismatchError, match="cannot map MTP tensor 'mtp.fc_hidden.weight'"):
        read_hf_heads([save(tmp_path / "m.safetensors", mtp)], "qwen35", N_TRUNK)


def test_error_fp8(tmp_path):
    mtp = qwen_mtp()
    mtp["mtp.layers.0.self_attn.o_proj.weight"] = np.zeros((H, NH * HD), np.uint8)
    f = tmp_path / "m.safetensors"
    specs, keep = {}, []
    for k, a in mtp.items():
        a = np.ascontiguousarray(a)
        keep.append(a)
        specs[k] = spec("float8_e4m3fn" if a.dtype == np.uint8 else str(a.dtype), a.shape, a)
    serialize_file(specs, str(f))
    with pytest.raises(BadFileError, match="dtype F8_E4M3"):
        read_hf_heads([f], "qwen35", N_TRUNK)
    mtp["mtp.layers.0.self_attn.o_proj.weight_scale_inv"] = rnd(1, 1)
    mtp["mtp.layers.0.self_attn.o_proj.weight"] = rnd(H, NH * HD)
    with pytest.raises(BadFileError, match="quantized checkpoint"):
        read_hf_heads([save(tmp_path / "q.safetensors", mtp)], "qwen35", N_TRUNK)


def test_error_duplicate_tensor(tmp_path):
    mtp = qwen_mtp()
    a = save(tmp_path / "a.safetensors", mtp)
    b = save(tmp_path / "b.safetensors", {"mtp.fc.weight": mtp["mtp.fc.weight"]})
    with pytest.raises(MismatchError, match="'mtp.fc.weight' is also in"):
        read_hf_heads([a, b], "qwen35", N_TRUNK)


def test_error_empty_dir_and_bad_index(tmp_path):
    with pytest.raises(BadFileError, match="no \\*.safetensors"):
        find_safetensors(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(BadFileError, match="unreadable safetensors index"):
        find_safetensors(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(BadFileError, match="none of the 1 shard"):
        find_safetensors(tmp_path)


def test_is_safetensors_source(tmp_path):
    assert not is_safetensors_source(tmp_path / "missing")
    assert not is_safetensors_source(tmp_path)
    f = save(tmp_path / "m.safetensors", qwen_mtp())
    assert is_safetensors_source(f) and is_safetensors_source(tmp_path)
    g = tmp_path / "t.gguf"
    g.write_bytes(b"GGUF" + b"\0" * 60)
    assert not is_safetensors_source(g)


def test_error_stale_index(tmp_path):
    mtp = qwen_mtp()
    save(tmp_path / "a.safetensors", mtp)
    save(tmp_path / "b.safetensors", qwen_trunk())
    weight_map = {k: "a.safetensors" for k in mtp} | {k: "b.safetensors" for k in qwen_trunk()}
    weight_map["mtp.fc.weight"] = "b.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(BadFileError, match="puts 'mtp.fc.weight' in this file, but it is not there") as e:
        read_hf_heads([tmp_path], "qwen35", N_TRUNK)
    assert e.value.path.name == "b.safetensors"
