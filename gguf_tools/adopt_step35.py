"""Adopt for Llama 3.x: a llama trunk whose rope takes frequency factors (`rope_freqs.weight`, llama 3
rope scaling, which glm4moe's rope has no place for) re-expressed as step35, whose rope takes them and
whose MTP graph llama.cpp runs (src/models/step35.cpp).

step35's trunk block is the llama block when dense: RMS norms, Q/K/V, NEOX rope with the per-layer
factors on full-attention layers, attention scale 1/sqrt(head_dim), `ffn_norm` before a SwiGLU MLP,
output norm and matrix. What differs (benchmarks/step35_probe.py measured the result against
llama.cpp's own llama logits: within its flash-attention on/off noise):
- Q/K rows move whole to NEOX order (gguf_tools.adopt.neox_order); every other byte is kept.
- `rope.dimension_count` is written doubled: step35's loader halves it for full-attention layers.
- `attention.sliding_window` and its pattern are required, and llama.cpp asserts some block is
  sliding-window (src/llama-model.cpp:2807): every trunk block is marked dense and the head block
  sliding-window, with a window of the whole context. So an adopted file always has a head slot
  (randomly initialised, for `train`), and that head gets no rope factors and rotates
  `rope.dimension_count_swa` (= head_dim) dims (`is_swa ? nullptr : rope_factors`).
- `expert_feed_forward_length` is required (no block uses it) and so is `output.weight`: tied
  embeddings are given the token embedding's bytes.
"""

from __future__ import annotations

from gguf import GGUFValueType

from gguf_tools.adopt import PROVENANCE_KEY, SourceDims, _permuted, _refuse, adopt_blocker, neox_order, source_dims
from gguf_tools.errors import RefusedError
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.gguf_write import KV, FileTensor, Tensor, WritePlan
from gguf_tools.names import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, block_index, block_suffix, key
from gguf_tools.step35_head import head_block_tensors
from gguf_tools.surgery import copy_kvs

TARGET = "step35"
ROPE_FREQS = "rope_freqs.weight"
_BLOCK = {
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
}


def wants_step35(gf: GGUFFile) -> bool:
    """A llama trunk with llama 3 rope factors: adopt re-expresses it as step35."""
    return gf.arch == "llama" and ROPE_FREQS in gf.tensors


def adopted(gf: GGUFFile) -> bool:
    """A step35 file `adopt` wrote from a Llama 3.x trunk (its head block dense, as this module writes it)."""
    return gf.arch == TARGET and bool(gf.get(PROVENANCE_KEY))


def plan_trunk(gf: GGUFFile, dims: SourceDims) -> list[Tensor]:
    out: list[Tensor] = []
    for t in gf.tensors.values():
        suffix = block_suffix(t.name)
        if block_index(t.name) is None and t.name not in (TOKEN_EMBD, OUTPUT_NORM, OUTPUT, ROPE_FREQS):
            raise _refuse(gf, f"tensor {t.name}: step35 has no place for it")
        if block_index(t.name) is not None and suffix not in _BLOCK:
            raise _refuse(gf, f"tensor {t.name}: step35's dense block has no place for it")
        if suffix in ("attn_q.weight", "attn_k.weight"):
            heads = dims.n_head[0] if suffix == "attn_q.weight" else dims.n_head_kv[0]
            out.append(_permuted(gf, t, neox_order(heads, dims.head_dim)))
        else:
            out.append(FileTensor(t.name, t.type, t.shape, t.n_bytes, gf.path, t.offset))
    if OUTPUT not in gf.tensors:  # (step35 requires an output matrix: tied embeddings lend theirs)
        e = gf.tensors[TOKEN_EMBD]
        out.append(FileTensor(OUTPUT, e.type, e.shape, e.n_bytes, gf.path, e.offset))
    return out


def _u32(name: str, v: int) -> KV:
    return KV(key(TARGET, name), int(v), GGUFValueType.UINT32)


def adopted_kvs(gf: GGUFFile, dims: SourceDims) -> list[KV]:
    """The source's key-values, `llama.*` renamed `step35.*`, plus what step35 needs (one head block)."""
    n = dims.n_layer
    added = [
        _u32("block_count", n + 1),
        _u32("nextn_predict_layers", 1),
        _u32("rope.dimension_count", 2 * dims.head_dim),
        _u32("rope.dimension_count_swa", dims.head_dim),
        _u32("attention.sliding_window", int(gf.arch_get("context_length", 4096))),
        KV(key(TARGET, "attention.sliding_window_pattern"), [0] * n + [1], GGUFValueType.ARRAY, GGUFValueType.UINT32),
        _u32("expert_feed_forward_length", dims.n_ff),
    ]
    names = {kv.key for kv in added}
    kvs = []
    for kv in copy_kvs(gf):
        if kv.key == "general.architecture":
            kv = KV(kv.key, TARGET, kv.type)
        elif kv.key.startswith(dims.arch + "."):
            kv = KV(TARGET + kv.key[len(dims.arch) :], kv.value, kv.type, kv.sub_type, raw=kv.raw)
        if kv.key not in names:
            kvs.append(kv)
    at = max((i + 1 for i, kv in enumerate(kvs) if kv.key.startswith(TARGET + ".")), default=len(kvs))
    kvs[at:at] = added
    kvs.append(KV(PROVENANCE_KEY, dims.arch, GGUFValueType.STRING))
    return kvs


def plan_adopt_step35(gf: GGUFFile, seed: int = 0, head_type: str = "f16") -> WritePlan:
    """The whole plan (always with a head slot: see the module docstring)."""
    dims = source_dims(gf)
    if len(set(dims.n_head_kv)) != 1:
        raise _refuse(gf, f"{key(gf.arch, 'attention.head_count_kv')} varies per layer: which one would the head use?")
    if "blk.0.attn_qkv.weight" in gf.tensors:
        raise _refuse(gf, "fused Q/K/V weights: step35's adoption moves Q and K rows apart")
    if any(block_suffix(n).endswith(".bias") for n in gf.tensors if block_index(n) is not None):
        raise RefusedError("cannot adopt: biases in a llama 3 block: step35's block has none", gf.path)
    tensors = plan_trunk(gf, dims)
    tensors += head_block_tensors(dims, seed=seed, head_type=head_type)
    return WritePlan(TARGET, gf.alignment, adopted_kvs(gf, dims), tensors)


def blocker(gf: GGUFFile) -> str | None:
    """Why `gf` cannot be adopted (one line, as adopt.adopt_blocker says it), step35 taking llama 3 trunks."""
    if not wants_step35(gf):
        return adopt_blocker(gf)
    try:
        plan_adopt_step35(gf)
    except RefusedError as e:
        return e.message.removeprefix("cannot adopt: ")
    return None


__all__ = ["TARGET", "wants_step35", "adopted", "plan_adopt_step35", "adopted_kvs", "plan_trunk", "blocker"]
