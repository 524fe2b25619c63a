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
from gguf import GGMLQuantizationType, quants

from gguf_tools import ops
from gguf_tools.adopt import with_head_kvs
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.gguf_write import ArrayTensor, FileTensor, WritePlan, check_output, write_gguf
from gguf_tools.glm4moe_head import HeadDims, head_block_tensors
from gguf_tools.surgery import SIDECAR_SHARED, PackOptions, copy_kvs

HEAD_TYPES = ("f16", "q8_0", "f32")
# a head-owned, full-vocabulary copy of the trunk's output matrix (nextn.shared_head_head)
OWN_OUTPUT_TYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0}


def own_output_tensor(trunk: GGUFFile, index: int, kind: str) -> ArrayTensor:
    """`blk.{index}.nextn.shared_head_head.weight`: the trunk's output matrix (or tied embedding),
    dequantized and requantized to `kind`. Full vocabulary, so drafts are unchanged except for rounding;
    llama.cpp's CPU backend repacks it for its fast kernels (the tied token embedding is not)."""
    from mtp_cli.train.trunk import read_f32

    if kind not in OWN_OUTPUT_TYPES:
        raise ValueError(f"unknown output type {kind!r} ({', '.join(OWN_OUTPUT_TYPES)})")
    out = read_f32(trunk, "output.weight" if "output.weight" in trunk.tensors else "token_embd.weight")
    qt = OWN_OUTPUT_TYPES[kind]
    return ArrayTensor(f"blk.{index}.nextn.shared_head_head.weight", qt, tuple(reversed(out.shape)),
                       quants.quantize(out, qt))


def drafted_output(trunk: GGUFFile, kind: str) -> np.ndarray:
    """The float32 values of own_output_tensor(trunk, _, kind): the matrix a head with that own
    output drafts with, so the one to train it against (Q4_0 rounding flips top-1 at close calls)."""
    t = own_output_tensor(trunk, 0, kind)
    return np.asarray(quants.dequantize(t.data, t.type), dtype=np.float32).reshape(tuple(reversed(t.shape)))


def sidecar_plan(trunk: GGUFFile, weights: Mapping[str, np.ndarray], head_type: str = "f16",
                 own_output: str | None = None) -> WritePlan:
    """An MTP-only sidecar for glm4moe trunk `trunk` holding a head block with `weights` (short names);
    `own_output` ("q4_0", "q8_0"): also a head-owned output matrix of that type."""
    lay = trunk.layout()
    n_trunk = lay.n_trunk
    kvs = copy_kvs(trunk)
    if lay.nextn_layers == 0:
        kvs = with_head_kvs(kvs, n_trunk)
    shared = [FileTensor(t.name, t.type, t.shape, t.n_bytes, trunk.path, t.offset)
              for n in SIDECAR_SHARED if (t := trunk.tensors.get(n)) is not None]
    head = head_block_tensors(n_trunk, HeadDims.from_gguf(trunk), dict(weights), head_type=head_type)
    if own_output:
        head.append(own_output_tensor(trunk, n_trunk, own_output))
    return WritePlan(trunk.arch, trunk.alignment, kvs, [*shared, *head])


def write_sidecar(trunk_path: str | os.PathLike[str], weights: Mapping[str, np.ndarray], out: str | os.PathLike[str],
                  head_type: str = "f16", overwrite: bool = False, own_output: str | None = None) -> ops.WriteResult:
    out = Path(out)
    check_output(out, [Path(trunk_path)], overwrite)
    plan = sidecar_plan(open_gguf(trunk_path), weights, head_type, own_output)
    write_gguf(plan, out)
    return ops.WriteResult(out, len(plan.tensors), plan.n_bytes, out.stat().st_size)


def export_model(trunk_path: str | os.PathLike[str], weights: Mapping[str, np.ndarray], out: str | os.PathLike[str],
                 head_type: str = "f16", overwrite: bool = False, own_output: str | None = None) -> ops.WriteResult:
    """The trunk with the trained head packed in (from a temporary sidecar, via ops.pack)."""
    trunk_path, out = Path(trunk_path), Path(out)
    check_output(out, [trunk_path], overwrite)
    has_head = open_gguf(trunk_path).layout().nextn_layers > 0
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".mtp-train-") as tmp:
        side = Path(tmp) / "head.gguf"
        write_sidecar(trunk_path, weights, side, head_type, own_output=own_output)
        return ops.pack(trunk_path, side, out, PackOptions(head_type="keep", replace=has_head), overwrite=overwrite)


__all__ = ["HEAD_TYPES", "OWN_OUTPUT_TYPES", "own_output_tensor", "drafted_output", "sidecar_plan", "write_sidecar", "export_model"]
