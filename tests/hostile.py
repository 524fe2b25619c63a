"""Hostile files: valid tiny models with one header value changed to what llama.cpp refuses or
crashes on, one case (at least) per rule of gguf_tools.limits that a tiny model can carry.

Each case names its rule, the base model it edits and the edit. `build(case, bases, out)` writes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as T

from gguf_tools import gguf_write
from gguf_tools.gguf_file import open_gguf
from gguf_tools.gguf_write import KV, ArrayTensor, FileTensor, WritePlan, write_gguf
from gguf_tools.surgery import copy_kvs


def edited(
    src: Path,
    out: Path,
    *,
    kvs: dict | None = None,
    drop_kvs: tuple = (),
    add: tuple = (),
    drop: tuple = (),
    arch: str | None = None,
    raw_kvs: dict[str, bytes] | None = None,
    rename: dict[str, str] | None = None,
    gap: bool = False,
) -> Path:
    """A copy of `src` with key-values set (`kvs`: key -> (value, type[, sub type]); `raw_kvs`: key ->
    encoded bytes) or removed, F32 tensors added or removed, tensors renamed, or (`gap`) tensor data
    spaced out past the alignment, written by our writer without any check."""
    gf = open_gguf(src)
    kv_list = [kv for kv in copy_kvs(gf) if kv.key not in drop_kvs]
    for k, spec in (kvs or {}).items():
        kv_list = [kv for kv in kv_list if kv.key != k] + [KV(k, spec[0], spec[1], *spec[2:])]
    for k, raw in (raw_kvs or {}).items():
        kv_list = [kv for kv in kv_list if kv.key != k] + [KV(k, None, T.ARRAY, raw=raw)]
    names = rename or {}
    tensors: list[Any] = [
        FileTensor(names.get(t.name, t.name), t.type, t.shape, t.n_bytes, src, t.offset)
        for t in gf.tensors.values()
        if t.name not in drop
    ]
    tensors += [ArrayTensor(n, QT.F32, tuple(reversed(a.shape)), np.asarray(a, np.float32)) for n, a in add]
    plan = WritePlan(arch or gf.arch, gf.alignment, kv_list, tensors)
    if not gap:
        write_gguf(plan, out)
        return out
    real = gguf_write._offsets
    try:  # every tensor one alignment further than llama.cpp expects
        gguf_write._offsets = lambda p: [o + i * p.alignment for i, o in enumerate(real(p))]  # type: ignore[assignment]
        write_gguf(plan, out)
    finally:
        gguf_write._offsets = real  # type: ignore[assignment]
    return out


def nested_array() -> bytes:
    """An array of one array of two uint32s, encoded (our writer refuses to encode one)."""
    inner = struct.pack("<IQ", T.UINT32, 2) + struct.pack("<II", 1, 2)
    return struct.pack("<IIQ", T.ARRAY, T.ARRAY, 1) + inner


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # the gguf_tools.limits rule it breaks first
    base: str  # qwen35 | glm4moe | llama (a tiny model from tests.factory)
    edit: dict[str, Any] = field(default_factory=dict)
    mtp: bool = False  # llama.cpp fails only once an MTP context is made
    hangs: bool = False  # llama.cpp loops for ever rather than failing


def _u32(k: str, v: int) -> dict:
    return {"kvs": {k: (v, T.UINT32)}}


G, Q, L = "glm4moe", "qwen35", "llama"
CASES: tuple[Case, ...] = (
    # the container
    Case("tensor name of 64 bytes", "tensor-name-length", G, {"add": (("x" * 57 + ".weight", np.ones(4)),)}),
    Case("array of arrays", "nested-array", G, {"raw_kvs": {"general.nested": nested_array()}}),
    Case("empty key", "empty-key", G, {"kvs": {"": (1, T.UINT32)}}),
    Case("tensor data spaced out", "tensor-offsets", G, {"gap": True}),
    # key types
    Case("block_count as int32", "key-type", G, {"kvs": {"glm4moe.block_count": (3, T.INT32)}}),
    Case("context_length as uint64", "key-type", G, {"kvs": {"glm4moe.context_length": (4096, T.UINT64)}}),
    Case("rms eps as float64", "key-type", G, {"kvs": {"glm4moe.attention.layer_norm_rms_epsilon": (1e-6, T.FLOAT64)}}),
    Case("name as uint32", "key-type", G, {"kvs": {"general.name": (7, T.UINT32)}}),
    Case(
        "head_count as a float array",
        "array-type",
        G,
        {"kvs": {"glm4moe.attention.head_count": ([4.0] * 3, T.ARRAY, T.FLOAT32)}},
    ),
    Case(
        "head_count array too short",
        "layer-array-length",
        G,
        {"kvs": {"glm4moe.attention.head_count": ([4, 4], T.ARRAY, T.UINT32)}},
    ),
    Case("no rms eps", "required-key", G, {"drop_kvs": ("glm4moe.attention.layer_norm_rms_epsilon",)}),
    Case("no expert_shared_count", "required-key", G, {"drop_kvs": ("glm4moe.expert_shared_count",)}),
    Case("no context_length", "required-key", Q, {"drop_kvs": ("qwen35.context_length",)}),
    Case("no ssm.state_size", "required-key", Q, {"drop_kvs": ("qwen35.ssm.state_size",)}),
    Case("no rope sections", "required-key", Q, {"drop_kvs": ("qwen35.rope.dimension_sections",)}),
    Case("unknown architecture", "required-key", G, {"arch": "glm9"}),
    # hyperparameters
    Case("block_count above the layer limit", "block-count", G, _u32("glm4moe.block_count", 600)),
    Case("block_count 0", "block-count", G, _u32("glm4moe.block_count", 0)),
    Case("more head blocks than blocks", "nextn-layers", G, _u32("glm4moe.nextn_predict_layers", 5)),
    Case("expert_count above the expert limit", "expert-count", G, _u32("glm4moe.expert_count", 2000)),
    Case("more experts used than exist", "experts-used", G, _u32("glm4moe.expert_used_count", 2)),
    Case("expert groups not below experts", "expert-groups", G, _u32("glm4moe.expert_group_count", 1)),
    Case("unknown rope scaling", "rope-scaling-type", G, {"kvs": {"glm4moe.rope.scaling.type": ("wobble", T.STRING)}}),
    Case("heads not a multiple of kv heads", "head-groups", G, _u32("glm4moe.attention.head_count_kv", 3)),
    Case(
        "kv heads varying per block",
        "layer-arrays-uniform",
        G,
        {"kvs": {"glm4moe.attention.head_count_kv": ([2, 4, 2], T.ARRAY, T.UINT32)}},
    ),
    Case("negative rms eps", "rms-eps", G, {"kvs": {"glm4moe.attention.layer_norm_rms_epsilon": (-1.0, T.FLOAT32)}}),
    Case("NaN rms eps", "rms-eps", Q, {"kvs": {"qwen35.attention.layer_norm_rms_epsilon": (float("nan"), T.FLOAT32)}}),
    # (the tiny glm4moe's only MoE block is its head: the MTP graph is where experts are routed)
    Case("unknown expert gating", "expert-gating", G, _u32("glm4moe.expert_gating_func", 7), mtp=True),
    Case("llama partial rope", "rope-dims-exact", L, _u32("llama.rope.dimension_count", 8)),
    Case("rope dims above the head dim", "rope-dims", G, _u32("glm4moe.rope.dimension_count", 20)),
    Case("odd rope dims", "rope-dims", G, _u32("glm4moe.rope.dimension_count", 7)),
    Case("rope dims 0", "rope-dims", G, _u32("glm4moe.rope.dimension_count", 0), hangs=True),
    Case("qwen35 rope dims above the head dim", "rope-dims", Q, _u32("qwen35.rope.dimension_count", 24)),
    Case(
        "rope sections summing to 0",
        "rope-sections",
        G,
        {"kvs": {"glm4moe.rope.dimension_sections": ([4, 4, -8, 0], T.ARRAY, T.INT32)}},
    ),
    Case(
        "rope sections past the head dim",
        "rope-sections",
        G,
        {"kvs": {"glm4moe.rope.dimension_sections": ([8, 8, 8, 0], T.ARRAY, T.INT32)}},
    ),
    Case(
        "qwen35 rope sections all 0",
        "rope-sections",
        Q,
        {"kvs": {"qwen35.rope.dimension_sections": ([0, 0, 0, 0], T.ARRAY, T.INT32)}},
    ),
    Case(
        "rope sections of 3",
        "layer-array-length",
        Q,
        {"kvs": {"qwen35.rope.dimension_sections": ([2, 1, 1], T.ARRAY, T.INT32)}},
    ),
    Case("value_length unlike key_length", "head-dims-equal", G, _u32("glm4moe.attention.value_length", 8)),
    Case(
        "glm4moe without experts",
        "glm4moe-experts",
        G,
        {"kvs": {"glm4moe.expert_count": (0, T.UINT32), "glm4moe.expert_used_count": (0, T.UINT32)}},
    ),
    Case("full_attention_interval 0", "recurrent-interval", Q, _u32("qwen35.full_attention_interval", 0)),
    Case("no attention block", "hybrid-layers", Q, _u32("qwen35.full_attention_interval", 5)),
    Case("v heads not a multiple of k heads", "ssm-heads", Q, _u32("qwen35.ssm.time_step_rank", 3)),
    Case("ssm group count 0", "ssm-heads", Q, _u32("qwen35.ssm.group_count", 0)),
    Case("ssm inner size unlike state x rank", "ssm-inner", Q, _u32("qwen35.ssm.inner_size", 48)),
    # the head block (an MTP context)
    Case("two head blocks for one", "one-head-block", G, _u32("glm4moe.nextn_predict_layers", 2), mtp=True),
    Case("qwen35 two head blocks", "one-head-block", Q, _u32("qwen35.nextn_predict_layers", 2), mtp=True),
    Case("dense head block", "head-block-moe", G, _u32("glm4moe.leading_dense_block_count", 3), mtp=True),
    Case("head without eh_proj", "head-tensors", G, {"drop": ("blk.2.nextn.eh_proj.weight",)}, mtp=True),
    # the vocabulary
    Case("unknown tokenizer", "tokenizer-model", G, {"kvs": {"tokenizer.ggml.model": ("wordpiece9", T.STRING)}}),
    Case("no tokenizer model", "tokenizer-model", G, {"drop_kvs": ("tokenizer.ggml.model",)}),
    Case("tokenizer none", "no-tokenizer", G, {"kvs": {"tokenizer.ggml.model": ("none", T.STRING)}}),
    Case("tokens as numbers", "token-list", G, {"kvs": {"tokenizer.ggml.tokens": ([1, 2, 3], T.ARRAY, T.UINT32)}}),
    Case(
        "token types shorter than the vocabulary",
        "token-arrays",
        G,
        {"kvs": {"tokenizer.ggml.token_type": ([1] * 100, T.ARRAY, T.INT32)}},
    ),
    Case(
        "token types as uint32",
        "token-arrays",
        G,
        {"kvs": {"tokenizer.ggml.token_type": ([1] * 300, T.ARRAY, T.UINT32)}},
    ),
    Case(
        "scores shorter than the vocabulary",
        "token-arrays",
        G,
        {"kvs": {"tokenizer.ggml.scores": ([0.0] * 10, T.ARRAY, T.FLOAT32)}},
    ),
    Case("scores as strings", "token-arrays", G, {"kvs": {"tokenizer.ggml.scores": (["0"] * 300, T.ARRAY, T.STRING)}}),
    Case("bpe without merges", "merges", G, {"kvs": {"tokenizer.ggml.model": ("gpt2", T.STRING)}}),
    Case("a token twice", "duplicate-token", G, {"tokens": (299, "<0xFF>")}),
    Case("a byte token that is not <0xXX>", "byte-token", G, {"tokens": (3, "ab")}),
    Case("bos id a string", "key-type", G, {"kvs": {"tokenizer.ggml.bos_token_id": ("1", T.STRING)}}),
    Case("add_bos_token as uint8", "key-type", G, {"kvs": {"tokenizer.ggml.add_bos_token": (1, T.UINT8)}}),
    # tensors against the header
    Case(
        "output_norm the wrong size",
        "tensor-shape",
        G,
        {"drop": ("output_norm.weight",), "add": (("output_norm.weight", np.ones(32)),)},
    ),
    Case("token embedding for another vocabulary", "tensor-shape", G, {"tokens_count": 299}),
    Case("a block past block_count", "blocks", G, {"add": (("blk.7.attn_norm.weight", np.ones(64)),)}),
)


def build(case: Case, bases: dict[str, Path], out: Path) -> Path:
    """Write `case` to `out`, editing its base model."""
    src = bases[case.base]
    edit = dict(case.edit)
    if "tokens" in edit or "tokens_count" in edit:
        gf = open_gguf(src)
        toks = gf.get("tokenizer.ggml.tokens")
        if "tokens" in edit:
            i, text = edit.pop("tokens")
            toks[i] = text
        else:
            n = edit.pop("tokens_count")
            toks = toks[:n]
            edit["kvs"] = {
                "tokenizer.ggml.scores": (gf.get("tokenizer.ggml.scores")[:n], T.ARRAY, T.FLOAT32),
                "tokenizer.ggml.token_type": (gf.get("tokenizer.ggml.token_type")[:n], T.ARRAY, T.INT32),
            }
        edit.setdefault("kvs", {})["tokenizer.ggml.tokens"] = (toks, T.ARRAY, T.STRING)
    return edited(src, out, **edit)
