"""Trained head weights -> the glm4moe head block (gguf_tools.glm4moe_head) -> a GGUF.

`write_sidecar` writes an MTP-only sidecar (the trunk's key-values with block_count + 1 and
nextn_predict_layers = 1, the shared token_embd / output_norm / output, and the head block), which
llama.cpp loads with -md. `export_model` packs it into the trunk (ops.pack), replacing the
trunk's head slot if it has one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from gguf_tools import ops, step35_head
from gguf_tools.adopt import SourceDims
from gguf_tools.adopt_step35 import TARGET as STEP35
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.gguf_write import FileTensor, WritePlan, check_output
from gguf_tools.glm4moe_head import HeadDims, head_block_tensors
from gguf_tools.names import SIDECAR_SHARED
from gguf_tools.own_output import own_output_tensor
from gguf_tools.surgery import PackOptions, copy_kvs, layout_kvs


def sidecar_plan(
    trunk: GGUFFile, weights: Mapping[str, np.ndarray], head_type: str = "f16", own_output: str | None = None
) -> WritePlan:
    """An MTP-only sidecar for glm4moe trunk `trunk` holding a head block with `weights` (short names);
    `own_output` ("q4_0", "q8_0"): also a head-owned output matrix of that type."""
    lay = trunk.layout()
    n_trunk = lay.n_trunk
    kvs = copy_kvs(trunk)
    if lay.nextn_layers == 0:
        kvs = layout_kvs(kvs, trunk.arch, n_trunk, n_trunk, 1, new_head=True)
    shared = [
        FileTensor(t.name, t.type, t.shape, t.n_bytes, trunk.path, t.offset)
        for n in SIDECAR_SHARED
        if (t := trunk.tensors.get(n)) is not None
    ]
    dims = HeadDims.from_gguf(trunk)
    if trunk.arch == STEP35:  # (an adopted Llama 3.x: adopt_step35's dense block, its names)
        sd = SourceDims("llama", n_trunk, dims.n_embd, dims.head_dim, [dims.n_head], [dims.n_head_kv], dims.n_ff)
        head = step35_head.head_block_tensors(sd, head_type=head_type, weights=weights)
    else:
        head = head_block_tensors(n_trunk, dims, dict(weights), head_type=head_type)
    if own_output:
        head.append(own_output_tensor(trunk, n_trunk, own_output))
    return WritePlan(trunk.arch, trunk.alignment, kvs, [*shared, *head])


def write_sidecar(
    trunk_path: str | os.PathLike[str],
    weights: Mapping[str, np.ndarray],
    out: str | os.PathLike[str],
    head_type: str = "f16",
    overwrite: bool = False,
    own_output: str | None = None,
) -> ops.WriteResult:
    out = Path(out)
    check_output(out, [Path(trunk_path)], overwrite)
    return ops.write_plan(sidecar_plan(open_gguf(trunk_path), weights, head_type, own_output), out, overwrite=overwrite)


def export_model(
    trunk_path: str | os.PathLike[str],
    weights: Mapping[str, np.ndarray],
    out: str | os.PathLike[str],
    head_type: str = "f16",
    overwrite: bool = False,
    own_output: str | None = None,
) -> ops.WriteResult:
    """The trunk with the trained head packed in (from a temporary sidecar, via ops.pack)."""
    trunk_path, out = Path(trunk_path), Path(out)
    check_output(out, [trunk_path], overwrite)
    has_head = open_gguf(trunk_path).layout().nextn_layers > 0
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".mtp-train-") as tmp:
        side = Path(tmp) / "head.gguf"
        write_sidecar(trunk_path, weights, side, head_type, own_output=own_output)
        return ops.pack(trunk_path, side, out, PackOptions(head_type="keep", replace=has_head), overwrite=overwrite)


__all__ = ["sidecar_plan", "write_sidecar", "export_model"]
