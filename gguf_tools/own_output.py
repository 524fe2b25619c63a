"""A head's own output matrix: `blk.{i}.nextn.shared_head_head.weight`, a requantized copy of the trunk's.

The head drafts through it instead of the trunk's output matrix (or tied embedding). Full
vocabulary, so drafts change only by rounding; a Q4_0 copy halves a draft step on SmolLM2
(llama.cpp's CPU backend repacks it for its fast kernels, which the tied Q8_0 embedding is not).
"""

from __future__ import annotations

import numpy as np
from gguf import quants

from gguf_tools.errors import RefusedError
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.gguf_write import ArrayTensor
from gguf_tools.names import OWN_OUTPUT, OWN_OUTPUT_TYPES, nextn_name


def own_output_tensor(trunk: GGUFFile, index: int, kind: str) -> ArrayTensor:
    """Head block `index`'s own output matrix: the trunk's, dequantized and requantized to `kind`."""
    if kind not in OWN_OUTPUT_TYPES:
        raise RefusedError(f"unknown output type {kind!r} ({', '.join(OWN_OUTPUT_TYPES)})")
    out = trunk.read_f32(trunk.output_name)
    qt = OWN_OUTPUT_TYPES[kind]
    return ArrayTensor(nextn_name(index, OWN_OUTPUT), qt, tuple(reversed(out.shape)), quants.quantize(out, qt))


def drafted_output(trunk: GGUFFile, kind: str) -> np.ndarray:
    """The float32 values of own_output_tensor(trunk, _, kind): the matrix a head with that own
    output drafts with, so the one to train it against (Q4_0 rounding flips top-1 at close calls)."""
    t = own_output_tensor(trunk, 0, kind)
    return np.asarray(quants.dequantize(t.data, t.type), dtype=np.float32).reshape(tuple(reversed(t.shape)))
