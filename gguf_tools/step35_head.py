"""The step35 MTP head block of an adopted Llama 3.x trunk (gguf_tools.adopt_step35): a dense step35
decoder block (its `load_block_mtp`: attention, `ffn_norm`, SwiGLU MLP) plus the nextn wiring
(`eh_proj`, `enorm`, `hnorm`), randomly initialised (matrices N(0, 1/fan_in), norms 1), or from
short-named weights (the trainer's: glm4moe_head's names, `post_attention_norm` being `ffn_norm`).

What llama.cpp's step35 `graph_mtp` computes with it differs from glm4moe's in two places: h (the
trunk's, and the head's own for the next draft step) is taken BEFORE the output norm, and the block
is sliding-window in an adopted file (no rope factors; a window of the whole context)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import numpy as np
from gguf import GGMLQuantizationType

from gguf_tools.adopt import SourceDims
from gguf_tools.gguf_write import ArrayTensor, Tensor
from gguf_tools.glm4moe_head import HeadDims
from gguf_tools.names import nextn_suffix
from gguf_tools.surgery import convert_head_tensor


def head_shapes(d: SourceDims) -> dict[str, tuple[int, ...]]:
    """Tensor suffix (after `blk.{i}.`) -> numpy-order shape: glm4moe's head's dense weights, step35's names."""
    dims = HeadDims(d.n_embd, d.n_head[-1], d.n_head_kv[-1], d.head_dim, d.n_ff)
    return {SHORT[k]: shape for k, shape in dims.shapes().items() if k in SHORT and k != "shared_head_norm"}


# the trainer's short weight names (gguf_tools.glm4moe_head's) -> step35 tensor suffixes
SHORT = {
    "attn_norm": "attn_norm.weight",
    "attn_q": "attn_q.weight",
    "attn_k": "attn_k.weight",
    "attn_v": "attn_v.weight",
    "attn_output": "attn_output.weight",
    "post_attention_norm": "ffn_norm.weight",
    "ffn_gate": "ffn_gate.weight",
    "ffn_up": "ffn_up.weight",
    "ffn_down": "ffn_down.weight",
    "eh_proj": nextn_suffix("eh_proj"),
    "enorm": nextn_suffix("enorm"),
    "hnorm": nextn_suffix("hnorm"),
    "shared_head_norm": nextn_suffix("shared_head_norm"),
}


def head_block_tensors(
    d: SourceDims,
    seed: int = 0,
    head_type: str = "f16",
    weights: Mapping[str, np.ndarray] | None = None,
    index: int = -1,
) -> list[Tensor]:
    """Block `blk.{index}.*` (default: n_layer): `weights` (short names) where given, else random
    (deterministic in (seed, name)); matrices in `head_type`, norms F32."""
    given = {SHORT[k]: np.asarray(v, np.float32) for k, v in (weights or {}).items() if k in SHORT}
    shapes = head_shapes(d)
    if SHORT["shared_head_norm"] in given:
        shapes[SHORT["shared_head_norm"]] = (d.n_embd,)
    out = []
    for suffix, shape in shapes.items():
        if suffix in given:
            arr = given[suffix]
        elif len(shape) == 1:
            arr = np.ones(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(suffix.encode())])
            arr = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
        name = f"blk.{d.n_layer if index < 0 else index}.{suffix}"
        t = ArrayTensor(name, GGMLQuantizationType.F32, tuple(reversed(arr.shape)), np.ascontiguousarray(arr))
        out.append(convert_head_tensor(t, head_type))
    return out


def unpack_head_block(arrays: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    """{tensor name: numpy-order array} of block `index` -> the trainer's short-named weights."""
    p = f"blk.{index}."
    return {short: np.asarray(arrays[p + suf], np.float32) for short, suf in SHORT.items() if p + suf in arrays}


__all__ = ["head_shapes", "head_block_tensors", "unpack_head_block", "SHORT"]
