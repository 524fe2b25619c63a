"""Path-level operations: open inputs, plan, check the output, write. What the CLI calls."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from gguf_tools.adopt import plan_adopt
from gguf_tools.adopt_step35 import plan_adopt_step35, wants_step35
from gguf_tools.errors import BadFileError
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.gguf_write import ArrayTensor, Progress, WritePlan, check_output, write_gguf
from gguf_tools.loadable import require_loadable
from gguf_tools.names import block_index
from gguf_tools.prescan import GGUF_MAGIC
from gguf_tools.surgery import HeadSet, PackOptions, heads_from_gguf, plan_extract, plan_pack, plan_strip

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteResult:
    path: Path
    tensors: int
    tensor_bytes: int
    file_bytes: int


def write_plan(plan: WritePlan, out: Path, progress: Progress | None = None, *, overwrite: bool = False) -> WriteResult:
    """Write a validated plan atomically, refusing to publish a file llama.cpp would not load; what was written."""
    log.info("%s: writing %d tensors, %.1f MB of tensor data", out, len(plan.tensors), plan.n_bytes / 1e6)
    t0 = time.perf_counter()
    write_gguf(plan, out, progress, overwrite=overwrite, verify=lambda scan: require_loadable(scan, out))
    log.info("%s: written and checked in %.2f s", out, time.perf_counter() - t0)
    return WriteResult(out, len(plan.tensors), plan.n_bytes, out.stat().st_size)


def open_input(path: Path) -> GGUFFile:
    """An input GGUF, refused if llama.cpp could not load even its trunk (a broken head may be what
    the operation removes: the output is checked in full)."""
    gf = open_gguf(path)
    require_loadable(gf.scan, gf.path, mtp=False)
    return gf


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def load_heads(source: Path, trunk: GGUFFile) -> HeadSet:
    """Heads from an MTP sidecar or donor GGUF, or from HF safetensors (file, files or folder)."""
    if not source.exists():
        raise BadFileError("no such file or folder", source)
    if source.is_file() and is_gguf(source):
        src = open_gguf(source)
        heads = heads_from_gguf(src)  # (first: an assistant drafter is refused for what it is)
        require_loadable(src.scan, src.path)  # its heads are what it is for: the MTP rules apply
        return heads
    from gguf_tools import hf  # safetensors only when asked for

    if not hf.is_safetensors_source(source):
        raise BadFileError(
            "is neither a GGUF file nor HF safetensors (a .safetensors file or a folder of them)", source
        )
    lay = trunk.layout()
    tensors = hf.read_hf_heads(hf.find_safetensors(source), trunk.arch, lay.n_trunk)
    blocks = {block_index(t.name) for t in tensors}
    arrays = [
        ArrayTensor(
            t.name,
            GGMLQuantizationType.F16 if t.data.dtype == np.float16 else GGMLQuantizationType.F32,
            tuple(reversed(t.data.shape)),
            t.data,
        )
        for t in tensors
    ]
    return HeadSet(source, lay.n_trunk, len(blocks), arrays)


def pack(
    trunk_path: Path,
    heads_source: Path,
    out: Path,
    opts: PackOptions = PackOptions(),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> WriteResult:
    check_output(out, [trunk_path, heads_source], overwrite)
    trunk = open_input(trunk_path)
    plan = plan_pack(trunk, load_heads(heads_source, trunk), opts)
    return write_plan(plan, out, progress, overwrite=overwrite)


def adopt(
    path: Path,
    out: Path,
    with_head_slot: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    seed: int = 0,
) -> WriteResult:
    """Re-express a llama / qwen2 / qwen3 GGUF as glm4moe (gguf_tools.adopt), or a llama one with
    llama 3 rope factors as step35 (gguf_tools.adopt_step35, always with its head slot); optionally
    append a randomly initialised MTP head block."""
    check_output(out, [path], overwrite)
    gf = open_input(path)
    plan = plan_adopt_step35(gf, seed) if wants_step35(gf) else plan_adopt(gf, with_head_slot, seed)
    return write_plan(plan, out, progress, overwrite=overwrite)


def strip(path: Path, out: Path, overwrite: bool = False, progress: Progress | None = None) -> WriteResult:
    check_output(out, [path], overwrite)
    return write_plan(plan_strip(open_input(path)), out, progress, overwrite=overwrite)


def extract(
    path: Path, out: Path, overwrite: bool = False, progress: Progress | None = None, head_only: bool = False
) -> WriteResult:
    check_output(out, [path], overwrite)
    return write_plan(plan_extract(open_input(path), head_only), out, progress, overwrite=overwrite)
