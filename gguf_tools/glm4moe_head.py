"""The glm4moe MTP head block: its tensors, names and shapes, from plain dense weights.

What llama.cpp's `graph_mtp` (src/models/glm4-moe.cpp) computes with head block `i = n_trunk`, at
position p, from token x_p and h = the trunk's hidden state of position p-1 taken AFTER `output_norm`
(the graph's `h_nextn`, what `llama_get_embeddings_nextn` returns):

    e = rms(embed(x_p)) * enorm          embed = nextn.embed_tokens, else token_embd
    g = rms(h) * hnorm
    x = eh_proj @ concat(e, g)            eh_proj: (n_embd, 2*n_embd), the embedding half first
    x = x + attn(rms(x) * attn_norm)      its own KV cache; NEOX rope over head_dim; optional Q/K norms
    y = rms(x) * post_attention_norm
    x = x + w * down_e(silu(gate_e y) * up_e y) + down_s(silu(gate_s y) * up_s y)
    logits = output(rms(x) * (nextn.shared_head_norm, else output_norm))

The block's FFN must be glm4moe's MoE (the loader makes every block >= leading_dense_block_count
MoE, and graph_mtp asserts ffn_gate_inp). With ONE routed expert (e) carrying the MLP and
`expert_weights_norm = true`, the expert weight is w = sigmoid(r)/sigmoid(r) = 1 exactly whatever
the router says (the router is written as zeros, `exp_probs_b` too). The shared expert (s) always
runs (graph_mtp adds it unconditionally): with its down projection zero it adds exactly 0 and the
block is an ordinary dense SwiGLU block; trained, it is a second half of the same MLP (e and s read
the same y), i.e. a SwiGLU of twice the width for the compute already being paid for.

Weights are given by short names in numpy (torch) order, (out, in):

    attn_norm (E)  attn_q (Hq*D, E)  attn_k (Hkv*D, E)  attn_v (Hkv*D, E)  attn_output (E, Hq*D)
    attn_q_norm (D), attn_k_norm (D)             only when dims.qk_norm
    attn_q.bias (Hq*D), attn_k.bias, attn_v.bias (Hkv*D)   only when dims.qkv_bias
    post_attention_norm (E)  ffn_gate (F, E)  ffn_up (F, E)  ffn_down (E, F)
    ffn_gate_shexp (F, E)  ffn_up_shexp (F, E)  ffn_down_shexp (E, F)   optional (down: zeros if absent)
    eh_proj (E, 2E)  enorm (E)  hnorm (E)
    embed_tokens (V, E)  shared_head_head (V, E)  shared_head_norm (E)   optional

Anything not given is initialised from `seed` (matrices N(0, 1/fan_in), norms 1, biases 0).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from gguf_tools.gguf_file import GGUFFile
from gguf_tools.gguf_write import ArrayTensor, Tensor
from gguf_tools.names import NEXTN_PARTS, nextn_suffix
from gguf_tools.surgery import convert_head_tensor

# short name -> tensor suffix in block `blk.{i}.` (for the plain, non-MoE weights)
BLOCK_NAMES = {
    "attn_norm": "attn_norm.weight",
    "attn_q": "attn_q.weight",
    "attn_k": "attn_k.weight",
    "attn_v": "attn_v.weight",
    "attn_output": "attn_output.weight",
    "attn_q_norm": "attn_q_norm.weight",
    "attn_k_norm": "attn_k_norm.weight",
    "attn_q.bias": "attn_q.bias",
    "attn_k.bias": "attn_k.bias",
    "attn_v.bias": "attn_v.bias",
    "post_attention_norm": "post_attention_norm.weight",
}
_NAMES = {**BLOCK_NAMES, **{part: nextn_suffix(part) for part in NEXTN_PARTS}}
SHEXP = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
_OPTIONAL = ("embed_tokens", "shared_head_head", "shared_head_norm", *SHEXP)
WEIGHT_NAMES: tuple[str, ...] = (*_NAMES, "ffn_gate", "ffn_up", "ffn_down", *SHEXP)


@dataclass(frozen=True)
class HeadDims:
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    qk_norm: bool = False  # per-head RMS norms on Q and K (as qwen3 trunks have)
    qkv_bias: bool = False  # Q/K/V biases (as qwen2 trunks have)

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> HeadDims:
        """The dims of a head for glm4moe trunk `gf`, its attention shaped like the trunk's blocks."""

        def scalar(k: str) -> int:
            v = gf.arch_get(k)
            return int(v[-1] if isinstance(v, list) else v)

        n_embd, n_head = scalar("embedding_length"), scalar("attention.head_count")
        n_head_kv = scalar("attention.head_count_kv") if gf.arch_get("attention.head_count_kv") is not None else n_head
        head_dim = (
            scalar("attention.key_length") if gf.arch_get("attention.key_length") is not None else n_embd // n_head
        )
        n_ff = scalar("expert_feed_forward_length")
        return cls(
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            qk_norm="blk.0.attn_q_norm.weight" in gf.tensors,
            qkv_bias="blk.0.attn_q.bias" in gf.tensors,
        )

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Numpy-order shapes of the short-named weights this head takes (optional ones included)."""
        E, D, F = self.n_embd, self.head_dim, self.n_ff
        q, kv = self.n_head * D, self.n_head_kv * D
        s: dict[str, tuple[int, ...]] = {
            "attn_norm": (E,),
            "attn_q": (q, E),
            "attn_k": (kv, E),
            "attn_v": (kv, E),
            "attn_output": (E, q),
            "post_attention_norm": (E,),
            "ffn_gate": (F, E),
            "ffn_up": (F, E),
            "ffn_down": (E, F),
            "ffn_gate_shexp": (F, E),
            "ffn_up_shexp": (F, E),
            "ffn_down_shexp": (E, F),
            "eh_proj": (E, 2 * E),
            "enorm": (E,),
            "hnorm": (E,),
            "shared_head_norm": (E,),
        }
        if self.qk_norm:
            s.update({"attn_q_norm": (D,), "attn_k_norm": (D,)})
        if self.qkv_bias:
            s.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
        return s


def single_expert_ffn(
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    gate_shexp: np.ndarray | None = None,
    up_shexp: np.ndarray | None = None,
    down_shexp: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """A dense SwiGLU MLP (gate, up: (F, E); down: (E, F)) as glm4moe's MoE FFN, by tensor suffix.

    One routed expert carries the MLP; a zero router and zero exp_probs_b (with sigmoid gating and
    expert_weights_norm the weight is exactly 1 anyway); the shared expert is zero unless given
    (trained, it is the second half of a 2F-wide MLP).
    """
    F, E = gate.shape
    if up.shape != (F, E) or down.shape != (E, F):
        raise ValueError(f"MLP shapes gate {gate.shape}, up {up.shape}, down {down.shape} do not agree")
    f32 = np.float32
    return {
        "ffn_gate_inp.weight": np.zeros((1, E), f32),
        "exp_probs_b.bias": np.zeros(1, f32),
        "ffn_gate_exps.weight": np.asarray(gate, f32)[None],
        "ffn_up_exps.weight": np.asarray(up, f32)[None],
        "ffn_down_exps.weight": np.asarray(down, f32)[None],
        "ffn_gate_shexp.weight": np.zeros((F, E), f32) if gate_shexp is None else np.asarray(gate_shexp, f32),
        "ffn_up_shexp.weight": np.zeros((F, E), f32) if up_shexp is None else np.asarray(up_shexp, f32),
        "ffn_down_shexp.weight": np.zeros((E, F), f32) if down_shexp is None else np.asarray(down_shexp, f32),
    }


def random_weights(dims: HeadDims, seed: int = 0) -> dict[str, np.ndarray]:
    """Every required short-named weight, deterministic in (seed, name)."""
    out = {}
    for name, shape in dims.shapes().items():
        if name in _OPTIONAL:
            continue
        if len(shape) == 1:
            out[name] = (np.zeros if name.endswith(".bias") else np.ones)(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            out[name] = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
    return out


def head_block_arrays(
    index: int, dims: HeadDims, weights: Mapping[str, np.ndarray] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """The head block `blk.{index}.*` as {tensor name: float32 array in numpy order}, in file order."""
    given = dict(weights or {})
    unknown = set(given) - set(WEIGHT_NAMES)
    if unknown:
        raise ValueError(f"unknown head weights {sorted(unknown)} (known: {', '.join(WEIGHT_NAMES)})")
    shapes = dims.shapes()
    for name, arr in given.items():
        if name in shapes and tuple(np.shape(arr)) != shapes[name]:
            raise ValueError(f"head weight {name} has shape {tuple(np.shape(arr))}, expected {shapes[name]}")
        if name not in shapes and name not in ("embed_tokens", "shared_head_head"):
            raise ValueError(
                f"head weight {name} does not fit these dims (qk_norm={dims.qk_norm}, qkv_bias={dims.qkv_bias})"
            )
    w = {**random_weights(dims, seed), **given}
    p = f"blk.{index}."
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    for name in (
        "attn_norm",
        "attn_q",
        "attn_q.bias",
        "attn_k",
        "attn_k.bias",
        "attn_v",
        "attn_v.bias",
        "attn_output",
        "attn_q_norm",
        "attn_k_norm",
        "post_attention_norm",
    ):
        if name in w:
            out[p + _NAMES[name]] = np.asarray(w[name], f32)
    ffn = single_expert_ffn(w["ffn_gate"], w["ffn_up"], w["ffn_down"], *(w.get(k) for k in SHEXP))
    out.update({p + k: v for k, v in ffn.items()})
    for name in ("eh_proj", "enorm", "hnorm", "embed_tokens", "shared_head_head", "shared_head_norm"):
        if name in w:
            out[p + _NAMES[name]] = np.asarray(w[name], f32)
    return out


def head_block_tensors(
    index: int, dims: HeadDims, weights: Mapping[str, np.ndarray] | None = None, seed: int = 0, head_type: str = "f16"
) -> list[Tensor]:
    """The head block as tensors for a WritePlan: matrices in `head_type` (f32, f16, bf16, q8_0; a row
    length q8_0 cannot take stays F32), norms, biases and the router F32; ggml shapes."""
    out = []
    for name, arr in head_block_arrays(index, dims, weights, seed).items():
        t = ArrayTensor(name, GGMLQuantizationType.F32, tuple(reversed(arr.shape)), np.ascontiguousarray(arr))
        out.append(convert_head_tensor(t, head_type))
    return out


def unpack_head_block(arrays: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    """The inverse of head_block_arrays: {tensor name: numpy-order array} -> short-named weights.

    Checks the MoE wrapping is the single-expert form (one routed expert); the shared expert's
    weights are returned when its down projection is not zero (it then adds to the MLP)."""
    p = f"blk.{index}."
    out = {}
    for short, suffix in _NAMES.items():
        if p + suffix in arrays:
            out[short] = np.asarray(arrays[p + suffix], np.float32)
    exps = {k: np.asarray(arrays[p + f"ffn_{k}_exps.weight"], np.float32) for k in ("gate", "up", "down")}
    if any(a.shape[0] != 1 for a in exps.values()):
        raise ValueError(f"block {index} has {exps['gate'].shape[0]} experts; a single-expert head has 1")
    out.update({f"ffn_{k}": a[0] for k, a in exps.items()})
    if np.any(np.asarray(arrays.get(p + "ffn_down_shexp.weight", 0.0)) != 0):
        out.update({k: np.asarray(arrays[p + k + ".weight"], np.float32) for k in SHEXP})
    return out
