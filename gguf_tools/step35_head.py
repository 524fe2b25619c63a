"""The step35 MTP head block of an adopted Llama 3.x trunk (gguf_tools.adopt_step35): a dense step35
decoder block (its `load_block_mtp`: attention, `ffn_norm`, SwiGLU MLP) plus the nextn wiring
(`eh_proj`, `enorm`, `hnorm`), randomly initialised (matrices N(0, 1/fan_in), norms 1), for `train`."""

from __future__ import annotations

import math
import zlib

import numpy as np
from gguf import GGMLQuantizationType

from gguf_tools.adopt import SourceDims
from gguf_tools.gguf_write import ArrayTensor, Tensor
from gguf_tools.names import nextn_suffix
from gguf_tools.surgery import convert_head_tensor


def head_shapes(d: SourceDims) -> dict[str, tuple[int, ...]]:
    """Tensor suffix (after `blk.{i}.`) -> numpy-order shape."""
    E, D, F = d.n_embd, d.head_dim, d.n_ff
    q, kv = d.n_head[-1] * D, d.n_head_kv[-1] * D
    return {
        "attn_norm.weight": (E,),
        "attn_q.weight": (q, E),
        "attn_k.weight": (kv, E),
        "attn_v.weight": (kv, E),
        "attn_output.weight": (E, q),
        "ffn_norm.weight": (E,),
        "ffn_gate.weight": (F, E),
        "ffn_up.weight": (F, E),
        "ffn_down.weight": (E, F),
        nextn_suffix("eh_proj"): (E, 2 * E),
        nextn_suffix("enorm"): (E,),
        nextn_suffix("hnorm"): (E,),
    }


def head_block_tensors(d: SourceDims, seed: int = 0, head_type: str = "f16") -> list[Tensor]:
    """Block `blk.{n_layer}.*`: matrices in `head_type`, norms F32; deterministic in (seed, name)."""
    out = []
    for suffix, shape in head_shapes(d).items():
        if len(shape) == 1:
            arr = np.ones(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(suffix.encode())])
            arr = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
        name = f"blk.{d.n_layer}.{suffix}"
        out.append(
            convert_head_tensor(ArrayTensor(name, GGMLQuantizationType.F32, tuple(reversed(shape)), arr), head_type)
        )
    return out


__all__ = ["head_shapes", "head_block_tensors"]
