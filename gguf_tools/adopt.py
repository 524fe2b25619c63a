"""Adopt: re-express a llama / qwen2 / qwen3 trunk exactly as a glm4moe trunk, which has an MTP graph.

glm4moe's trunk graph (src/models/glm4-moe.cpp) is the llama block when every layer is dense
(`leading_dense_block_count = block_count`): RMS norms, Q/K/V (optional biases, optional per-head
Q/K norms), NEOX rope over the whole head, attention scale 1/sqrt(head_dim), a post-attention RMS
norm (llama's `ffn_norm`, renamed `post_attention_norm`) before a SwiGLU MLP, output norm, output
matrix or tied embeddings. What differs is bookkeeping, and for llama the rope layout:

- llama ropes adjacent pairs (2i, 2i+1) of each head (LLAMA_ROPE_TYPE_NORM), because
  convert_hf_to_gguf permuted the HF Q/K rows; glm4moe ropes (i, i+D/2) (NEOX), the HF order. Both
  rotate pair i by the same angle, so moving whole rows back,
  `neox_row[h*D + j*D/2 + i] = llama_row[h*D + 2*i + j]`, gives the same attention scores. Rows
  move whole (quantized blocks and all): nothing is requantized. qwen2/qwen3 already rope NEOX.
- glm4moe's loader asserts at least one expert: `expert_count = expert_used_count =
  expert_shared_count = 1`, `expert_feed_forward_length = feed_forward_length`; no trunk layer
  uses them (all dense), but an MTP head block does (gguf_tools.glm4moe_head).

Everything the glm4moe graph cannot express is refused with one line naming the key or tensor.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGUFValueType

from gguf_tools.errors import RefusedError
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.gguf_write import KV, FileTensor, RowOrderTensor, Tensor, WritePlan
from gguf_tools.names import (
    ADOPT_TARGET,
    ADOPTABLE_ARCHS,
    MTP_ARCHS,
    OUTPUT,
    OUTPUT_NORM,
    TOKEN_EMBD,
    block_index,
    block_suffix,
    key,
)
from gguf_tools.prescan import TensorEntry
from gguf_tools.surgery import copy_kvs, layout_kvs

log = logging.getLogger(__name__)

TARGET = ADOPT_TARGET
PROVENANCE_KEY = "mtp_cli.adopted_from"  # records the source arch in the adopted file
EXPERT_GATING_SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

# Per-block tensors the three source graphs read and glm4moe reads the same way (name kept).
_COMMON = {
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_qkv.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_qkv.bias",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    # per-tensor scales (e.g. NVFP4 scale2) that glm4moe's attention still applies
    "attn_q.scale",
    "attn_k.scale",
    "attn_v.scale",
    "attn_qkv.scale",
    "attn_output.scale",
}
_RENAMED = {"ffn_norm.weight": "post_attention_norm.weight"}
_EXTRA = {"llama": set(), "qwen2": set(), "qwen3": {"attn_q_norm.weight", "attn_k_norm.weight"}}
_REQUIRED = (
    "attn_norm.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
_GLOBAL = {TOKEN_EMBD, OUTPUT_NORM, OUTPUT, "output.scale"}

# Tensors with a specific reason they cannot be expressed (matched on the suffix after blk.N.).
_WHY_NOT = [
    # (a llama trunk with them is adopted as step35 instead: gguf_tools.adopt_step35)
    (re.compile(r"^rope_freqs\.weight$"), "rope frequency factors (llama 3 rope scaling): glm4moe's rope takes none"),
    (
        re.compile(r"^rope_factors_(long|short)\.weight$"),
        "long/short rope factors (longrope): glm4moe's rope takes none",
    ),
    (re.compile(r"^attn_output\.bias$"), "an attention-output bias: glm4moe's attention output has none"),
    (re.compile(r"^ffn_(gate|up|down)\.bias$"), "an FFN bias: glm4moe's dense FFN has none"),
    (re.compile(r"^ffn_(gate|up|down)\.scale$"), "an FFN weight scale: glm4moe's dense FFN ignores it"),
    (re.compile(r"^output\.bias$"), "an output bias: glm4moe's output matrix has none"),
    (
        re.compile(r"^(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))\."),
        "mixture-of-experts weights: only dense llama-family trunks can be adopted",
    ),
    (re.compile(r"^cls(_out)?\."), "a classifier head: glm4moe has none"),
]


@dataclass(frozen=True)
class SourceDims:
    arch: str
    n_layer: int
    n_embd: int
    head_dim: int
    n_head: list[int]  # per layer
    n_head_kv: list[int]
    n_ff: int  # the last layer's FFN width (expert_feed_forward_length, for a head block)


def _refuse(gf: GGUFFile, msg: str) -> RefusedError:
    return RefusedError(f"cannot adopt: {msg}", gf.path)


def _per_layer(gf: GGUFFile, name: str, n_layer: int, default: object = None) -> list[int]:
    v = gf.arch_get(name, default)
    if v is None:
        raise _refuse(gf, f"{key(gf.arch, name)} is missing")
    if isinstance(v, list):
        if len(v) != n_layer or not all(isinstance(x, int) for x in v):
            raise _refuse(gf, f"{key(gf.arch, name)} has {len(v)} entries for {n_layer} blocks")
        return list(v)
    if not isinstance(v, int) or v <= 0:
        raise _refuse(gf, f"{key(gf.arch, name)} is {v!r}")
    return [v] * n_layer


def source_dims(gf: GGUFFile) -> SourceDims:
    """Check the key-values of an adoptable source and read its dims. Raises RefusedError."""
    arch = gf.arch
    if arch == TARGET:
        raise RefusedError("is already glm4moe (an arch with an MTP graph): pack a head into it instead", gf.path)
    if arch in MTP_ARCHS:
        raise RefusedError(f"{arch} already has an MTP graph in llama.cpp: nothing to adopt", gf.path)
    if arch not in ADOPTABLE_ARCHS:
        raise _refuse(gf, f"architecture {arch!r} is not one adopt re-expresses ({', '.join(ADOPTABLE_ARCHS)})")
    k = lambda name: key(arch, name)  # noqa: E731

    n_layer = gf.arch_get("block_count")
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise _refuse(gf, f"{k('block_count')} is {n_layer!r}")
    if gf.arch_get("nextn_predict_layers", 0):
        raise _refuse(gf, f"{k('nextn_predict_layers')} is set on an arch without an MTP graph")
    n_embd = gf.arch_get("embedding_length")
    if not isinstance(n_embd, int) or n_embd <= 0:
        raise _refuse(gf, f"{k('embedding_length')} is {n_embd!r}")
    n_head = _per_layer(gf, "attention.head_count", n_layer)
    n_head_kv = _per_layer(gf, "attention.head_count_kv", n_layer, gf.arch_get("attention.head_count"))
    n_ff = _per_layer(gf, "feed_forward_length", n_layer)
    if len(set(n_head)) != 1:
        raise _refuse(gf, f"{k('attention.head_count')} varies per layer")
    d_k = gf.arch_get("attention.key_length", n_embd // n_head[0])
    d_v = gf.arch_get("attention.value_length", n_embd // n_head[0])
    if d_k != d_v:
        raise _refuse(
            gf,
            f"{k('attention.key_length')}={d_k} differs from {k('attention.value_length')}={d_v}: "
            "glm4moe needs one head size",
        )
    if d_k % 2:
        raise _refuse(gf, f"head size {d_k} is odd")
    n_rot = gf.arch_get("rope.dimension_count", d_k)
    if n_rot != d_k:
        raise _refuse(gf, f"{k('rope.dimension_count')}={n_rot} is not the head size {d_k} (partial rotary)")
    if gf.arch_get("attention.layer_norm_rms_epsilon") is None:
        raise _refuse(gf, f"{k('attention.layer_norm_rms_epsilon')} is missing")

    _refuse_unrepresentable(gf, d_k)
    return SourceDims(arch, n_layer, n_embd, d_k, n_head, n_head_kv, n_ff[-1])


def _refuse_unrepresentable(gf: GGUFFile, d_k: int) -> None:
    """What the glm4moe graph cannot express: experts, rope scaling, a custom attention scale,
    sliding windows, keys glm4moe reads differently."""
    k = lambda name: key(gf.arch, name)  # noqa: E731
    if gf.arch_get("expert_count", 0):
        raise _refuse(
            gf,
            f"{k('expert_count')}={gf.arch_get('expert_count')}: a mixture of experts; "
            "only dense trunks can be adopted",
        )
    scaling = gf.arch_get("rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise _refuse(gf, f"{k('rope.scaling.type')}={scaling!r}: rope scaling is not carried over to glm4moe")
    for name in ("rope.scaling.factor", "rope.scale_linear"):
        f = gf.arch_get(name)
        if f not in (None, 0.0, 1.0):
            raise _refuse(gf, f"{k(name)}={f!r}: rope scaling is not carried over to glm4moe")
    scale = gf.arch_get("attention.scale")
    if scale not in (None, 0.0) and not math.isclose(scale, 1 / math.sqrt(d_k), rel_tol=1e-6):
        raise _refuse(gf, f"{k('attention.scale')}={scale!r}: glm4moe's attention scale is fixed at 1/sqrt({d_k})")
    if gf.arch_get("attention.sliding_window", 0):
        raise _refuse(
            gf,
            f"{k('attention.sliding_window')}={gf.arch_get('attention.sliding_window')}: "
            "glm4moe has no sliding-window attention",
        )
    for name in ("attention.sliding_window_pattern", "rope.dimension_sections", "leading_dense_block_count"):
        if gf.has(k(name)) and gf.arch_get(name) not in (False, 0):
            raise _refuse(gf, f"{k(name)} is set: glm4moe would read it differently")


# ---- tensors -----------------------------------------------------------------------------------


def neox_order(n_heads: int, head_dim: int) -> list[int]:
    """Row order taking llama's interleaved Q/K rows to NEOX order: output row h*D + j*D/2 + i is
    llama row h*D + 2*i + j (the inverse of convert_hf_to_gguf's LlamaModel.permute)."""
    half = head_dim // 2
    return [h * head_dim + 2 * i + j for h in range(n_heads) for j in range(2) for i in range(half)]


def _rows(t: TensorEntry) -> tuple[int, int]:
    """(number of rows, bytes per row) where a row is one ne0 run; a 1-D tensor's rows are its elements."""
    block, type_size = GGML_QUANT_SIZES[t.type]
    if len(t.shape) == 1:
        if block != 1:
            raise ValueError(f"1-D tensor {t.name} is block-quantized ({t.type.name})")
        return t.shape[0], type_size
    n_rows = 1
    for d in t.shape[1:]:
        n_rows *= d
    return n_rows, t.n_bytes // n_rows


def _permuted(gf: GGUFFile, t: TensorEntry, order: list[int]) -> RowOrderTensor:
    try:
        n_rows, row_bytes = _rows(t)
    except ValueError as e:
        raise _refuse(gf, str(e)) from None
    if n_rows != len(order) or (len(t.shape) > 2 and any(d != 1 for d in t.shape[2:])):
        raise _refuse(gf, f"tensor {t.name} has shape {list(t.shape)}, expected {len(order)} rows")
    return RowOrderTensor(t.name, t.type, t.shape, t.n_bytes, gf.path, t.offset, row_bytes, tuple(order))


def _why_not(suffix: str) -> str | None:
    for pat, why in _WHY_NOT:
        if pat.search(suffix):
            return why
    return None


def plan_trunk_tensors(gf: GGUFFile, dims: SourceDims) -> list[Tensor]:
    """The trunk as glm4moe: every tensor copied byte for byte except llama's Q/K rows, moved whole."""
    allowed = _COMMON | set(_RENAMED) | _EXTRA[dims.arch]
    D = dims.head_dim
    out: list[Tensor] = []
    seen: set[str] = set()
    for t in gf.tensors.values():
        i = block_index(t.name)
        suffix = block_suffix(t.name)
        why = _why_not(suffix)
        if why:
            raise _refuse(gf, f"tensor {t.name} is {why}")
        if i is None:
            if t.name not in _GLOBAL:
                raise _refuse(gf, f"tensor {t.name} has no counterpart in glm4moe")
            out.append(FileTensor(t.name, t.type, t.shape, t.n_bytes, gf.path, t.offset))
            seen.add(t.name)
            continue
        if i >= dims.n_layer:
            raise _refuse(gf, f"tensor {t.name} is past the last block ({key(gf.arch, 'block_count')}={dims.n_layer})")
        if suffix not in allowed:
            raise _refuse(gf, f"tensor {t.name} has no counterpart in glm4moe ({dims.arch} does not use it either)")
        seen.add(t.name)
        name = f"blk.{i}.{_RENAMED.get(suffix, suffix)}"
        hq, hkv = dims.n_head[i], dims.n_head_kv[i]
        order = None
        if dims.arch == "llama":  # un-permute Q and K (weights and biases; a fused QKV's Q and K parts)
            q, k = neox_order(hq, D), neox_order(hkv, D)
            if suffix.startswith("attn_q."):
                order = q
            elif suffix.startswith("attn_k."):
                order = k
            elif suffix.startswith("attn_qkv."):
                nq, nk = hq * D, hkv * D
                order = q + [nq + r for r in k] + list(range(nq + nk, nq + 2 * nk))
            if suffix.endswith(".scale"):
                order = None  # a per-tensor scalar
        if order is not None:
            out.append(_permuted(gf, t, order))
        else:
            out.append(FileTensor(name, t.type, t.shape, t.n_bytes, gf.path, t.offset))
    for need in (TOKEN_EMBD, OUTPUT_NORM):
        if need not in seen:
            raise _refuse(gf, f"tensor {need} is missing")
    for i in range(dims.n_layer):
        p = f"blk.{i}."
        for suffix in _REQUIRED + tuple(sorted(_EXTRA[dims.arch])):
            if p + suffix not in seen:
                raise _refuse(gf, f"tensor {p + suffix} is missing")
        if p + "attn_qkv.weight" not in seen and not all(p + f"attn_{x}.weight" in seen for x in "qkv"):
            raise _refuse(gf, f"tensors {p}attn_q/k/v.weight (or {p}attn_qkv.weight) are missing")
    return out


# ---- key-values --------------------------------------------------------------------------------


def _u32(name: str, v: int) -> KV:
    return KV(key(TARGET, name), int(v), GGUFValueType.UINT32)


def adopted_kvs(gf: GGUFFile, dims: SourceDims) -> list[KV]:
    """The source's key-values, `{arch}.*` renamed `glm4moe.*`, plus what glm4moe needs."""
    src = dims.arch
    kvs: list[KV] = []
    for kv in copy_kvs(gf):
        if kv.key == "general.architecture":
            kv = KV(kv.key, TARGET, kv.type)
        elif kv.key.startswith(src + "."):
            kv = KV(TARGET + kv.key[len(src) :], kv.value, kv.type, kv.sub_type, raw=kv.raw)  # same value
        kvs.append(kv)
    kvs = [kv for kv in kvs if kv.key != key(TARGET, "rope.dimension_count")]
    added = [
        _u32("rope.dimension_count", dims.head_dim),
        _u32("leading_dense_block_count", dims.n_layer),
        _u32("expert_count", 1),
        _u32("expert_used_count", 1),
        _u32("expert_shared_count", 1),
        _u32("expert_feed_forward_length", dims.n_ff),
        KV(key(TARGET, "expert_weights_scale"), 1.0, GGUFValueType.FLOAT32),
        KV(key(TARGET, "expert_weights_norm"), True, GGUFValueType.BOOL),
        _u32("expert_gating_func", EXPERT_GATING_SIGMOID),
    ]
    names = {kv.key for kv in added}
    kvs = [kv for kv in kvs if kv.key not in names]
    # after the last glm4moe.* key, so the arch's keys stay together
    at = max((n + 1 for n, kv in enumerate(kvs) if kv.key.startswith(TARGET + ".")), default=len(kvs))
    kvs[at:at] = added
    kvs.append(KV(PROVENANCE_KEY, src, GGUFValueType.STRING))
    return kvs


def plan_adopt(gf: GGUFFile, with_head_slot: bool = False, seed: int = 0, head_type: str = "f16") -> WritePlan:
    """The whole plan, validated before a byte is written. `with_head_slot` appends a randomly
    initialised glm4moe head block (gguf_tools.glm4moe_head) for training or testing."""
    dims = source_dims(gf)
    tensors = plan_trunk_tensors(gf, dims)
    kvs = adopted_kvs(gf, dims)
    if with_head_slot:
        from gguf_tools.glm4moe_head import HeadDims, head_block_tensors

        if len(set(dims.n_head_kv)) != 1:
            raise _refuse(
                gf, f"{key(gf.arch, 'attention.head_count_kv')} varies per layer: which one would the head use?"
            )
        hd = HeadDims(
            dims.n_embd,
            dims.n_head[-1],
            dims.n_head_kv[-1],
            dims.head_dim,
            dims.n_ff,
            qk_norm=dims.arch == "qwen3",
            qkv_bias="blk.0.attn_q.bias" in gf.tensors,
        )
        tensors += head_block_tensors(dims.n_layer, hd, seed=seed, head_type=head_type)
        kvs = layout_kvs(kvs, TARGET, dims.n_layer, dims.n_layer, 1, new_head=True)
    return WritePlan(TARGET, gf.alignment, kvs, tensors)


def adopt_blocker(gf: GGUFFile) -> str | None:
    """Why `gf` cannot be adopted (one line), or None if it can. For inspect."""
    try:
        plan_trunk_tensors(gf, source_dims(gf))
    except RefusedError as e:
        return e.message.removeprefix("cannot adopt: ")
    return None


__all__ = [
    "TARGET",
    "PROVENANCE_KEY",
    "SourceDims",
    "source_dims",
    "neox_order",
    "plan_trunk_tensors",
    "adopted_kvs",
    "plan_adopt",
    "adopt_blocker",
]
