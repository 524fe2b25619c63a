"""MTP head tensors from a Hugging Face safetensors checkpoint, as llama.cpp's converter names and shapes them.

`mtp-cli pack TRUNK.gguf --heads SOURCE` grafts these into a trunk GGUF. Only the MTP/nextn
tensors are read; trunk tensors are recognised by name and never read. Three parts, each
mirroring a part of the converter (vendored in llama-cpp-python 0.3.36, `conversion/*.py`):

    files.py       finding the files, shard indexes, reading tensors as the converter keeps them
    naming.py      which tensors are MTP heads and their GGUF names, per family (a table)
    transforms.py  what the converter does to a tensor on its way (splits, stacks, +1 norms)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_tools.errors import BadFileError, MismatchError
from gguf_tools.hf.files import FLOAT_KEEP, NUMPY_CASTABLE, Catalog, find_safetensors, is_safetensors_source
from gguf_tools.hf.naming import HF_HEAD_ARCHS, LAYER_RE, Family, Heads, family_of, gguf_namer, select_heads
from gguf_tools.hf.transforms import GGUFName, Step, expert_steps, fused_experts_step, kv_b_step, simple_step
from gguf_tools.names import REQUIRED_NEXTN, nextn_name

_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_EXPERTS_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(?:\.weight)?$")


@dataclass(frozen=True)
class HeadTensor:
    name: str  # GGUF name, e.g. "blk.2.nextn.eh_proj.weight"
    data: np.ndarray  # float32 / float16 (bf16 converted to float32), numpy (row-major) shape = reversed GGUF ne


def _check_dtype(cat: Catalog, orig: str) -> None:
    dtype = cat.dtype(orig)
    if dtype not in FLOAT_KEEP and dtype != "BF16" and dtype not in NUMPY_CASTABLE:
        raise BadFileError(
            f"tensor {orig!r} has dtype {dtype}; only F32/F16/BF16 (and plain ints/F64) are "
            f"supported (quantized checkpoints are not)",
            cat.where[orig],
        )


def _steps(cat: Catalog, fam: Family, heads: Heads, gguf_name: GGUFName) -> list[Step]:
    steps: list[Step] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}
    for new, orig in heads.renamed.items():
        bid = int(LAYER_RE.match(new).group(1))  # type: ignore[union-attr]  # renamed names are layer names
        _check_dtype(cat, orig)
        if m := _EXPERT_RE.match(new):
            experts.setdefault((bid, m.group(3)), {})[int(m.group(2))] = orig
        elif m := _FUSED_EXPERTS_RE.match(new):
            steps.append(fused_experts_step(cat, bid, m.group(2), new, orig, gguf_name))
        elif ".mlp.experts." in new:
            raise MismatchError(f"unrecognised expert tensor {orig!r}", cat.where[orig])
        elif fam.split_kv_b and new.endswith("kv_b_proj.weight"):
            steps.append(kv_b_step(cat, bid, new, orig, heads.renamed, gguf_name))
        else:
            plus_one = (
                fam.plus_one_norms and new.endswith("norm.weight") and not new.endswith("linear_attn.norm.weight")
            )
            steps.append(simple_step(cat, bid, gguf_name(new), orig, plus_one))
    steps.extend(expert_steps(cat, experts, gguf_name))
    return sorted(steps, key=lambda s: (s.bid, s.outputs[0]))


def _check_required(steps: Sequence[Step], fam: Family, heads: Heads, where: Path | None) -> None:
    """The nextn tensors llama.cpp's loader requires (qwen puts them on the first head block only)."""
    produced = {o for s in steps for o in s.outputs}
    for bid in heads.head_bids if fam.nextn_on_every_head else heads.head_bids[:1]:
        for part in REQUIRED_NEXTN:
            if nextn_name(bid, part) not in produced:
                raise MismatchError(f"incomplete MTP head: no tensor for {nextn_name(bid, part)}", where)


def iter_hf_heads(
    sources: Sequence[Path] | Path, arch: str, n_trunk: int, n_nextn: int | None = None
) -> Iterator[HeadTensor]:
    """Like `read_hf_heads`, one tensor at a time (all checks on names, shapes and dtypes run first)."""
    paths = [Path(sources)] if isinstance(sources, (str, Path)) else [Path(s) for s in sources]
    if not paths:
        raise BadFileError("no head source given")
    parents = {s.parent for s in paths}
    where = paths[0] if len(paths) == 1 else (parents.pop() if len(parents) == 1 else None)
    fam = family_of(arch)
    with ExitStack() as stack:
        cat = Catalog(paths, stack)
        heads = select_heads(cat, fam, arch, n_trunk, n_nextn, where)
        steps = _steps(cat, fam, heads, gguf_namer(cat, arch, heads, where))
        _check_required(steps, fam, heads, where)
        for step in steps:
            for name, data in zip(step.outputs, step.load(), strict=True):
                yield HeadTensor(name, data)


def read_hf_heads(
    sources: Sequence[Path] | Path, arch: str, n_trunk: int, n_nextn: int | None = None
) -> list[HeadTensor]:
    """The MTP head tensors of a HF safetensors checkpoint, as llama.cpp's converter would write them for a
    trunk of ARCH with N_TRUNK blocks (head blocks are `blk.{n_trunk}` ...). SOURCES are files or directories.
    N_NEXTN, if given, is the number of head blocks the checkpoint must hold. Sorted by block, then name."""
    return list(iter_hf_heads(sources, arch, n_trunk, n_nextn))


__all__ = ["HF_HEAD_ARCHS", "HeadTensor", "find_safetensors", "is_safetensors_source", "iter_hf_heads", "read_hf_heads"]
