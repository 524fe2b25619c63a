"""Which HF tensors are MTP heads, and their GGUF names, family by family, as llama.cpp's converter maps them.

* every arch: `ModelBase.filter_tensors` (base.py:590-600) renames `*e_score_correction_bias` to
  `*e_score_correction.bias` and drops `language_model.`; names are then mapped with
  `gguf.get_tensor_name_map(arch, n_blocks)` (base.py:627).
* the qwen family (qwen35, qwen35moe, qwen3next; `_QwenMtpMixin`, qwen.py:322-339): `model.mtp.*` ->
  `mtp.*`; `mtp.layers.{i}.X` -> `model.layers.{n_trunk+i}.X`; `mtp.fc` / `mtp.pre_fc_norm_embedding` /
  `mtp.pre_fc_norm_hidden` / `mtp.norm` -> `model.layers.{n_trunk}.{eh_proj,enorm,hnorm,shared_head.norm}`.
* the nextn family (glm4moe, glm.py:130-146; deepseek2, whose nextn layers `Glm4MoeLiteModel` keeps,
  glm.py:284-300): the head is `model.layers.{n}` with n >= num_hidden_layers.

The installed gguf package (0.19.0) lists NEXTN_* tensors only for glm4moe; for the other archs the
nextn names come from the same gguf tables (`TensorNameMap.block_mappings_cfg[NEXTN_*]`, `TENSOR_NAMES`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import gguf

from gguf_tools.archs import HF_HEAD_ARCHS, record
from gguf_tools.errors import BadFileError, MismatchError
from gguf_tools.hf.files import Catalog

LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
_QUANT_SUFFIXES = ("_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale", ".qweight", ".qzeros", ".scales")
_NEXTN_TENSORS = tuple(t for t in gguf.MODEL_TENSOR if t.name.startswith("NEXTN_"))
# qwen.py:327-332
_QWEN_REMAP = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}

HeadName = tuple[str, int] | None | str  # (converted name, head index); None: a trunk tensor; str: unmappable


def _qwen_head_name(name: str, n_trunk: int) -> HeadName:
    """_QwenMtpMixin.filter_tensors, qwen.py:322-339."""
    if name.startswith("model.mtp."):
        name = name.replace("model.", "", 1)
    if not name.startswith("mtp."):
        return None
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        i = int(parts[2])
        return f"model.layers.{n_trunk + i}.{parts[3]}", i
    if len(parts) == 3 and parts[1] in _QWEN_REMAP:
        return f"model.layers.{n_trunk}.{_QWEN_REMAP[parts[1]]}.{parts[2]}", 0
    return name


def _nextn_head_name(name: str, n_trunk: int) -> HeadName:
    m = LAYER_RE.match(name)
    if m is None or int(m.group(1)) < n_trunk:
        return None
    return name, int(m.group(1)) - n_trunk


@dataclass(frozen=True)
class Family:
    """How one family of checkpoints names and stores its MTP heads."""

    expected: str  # where its MTP tensors are, for messages ({n}: the trunk's block count)
    head_name: Callable[[str, int], HeadName]
    plus_one_norms: bool  # RMSNorm weights stored zero-centred (qwen.py:401-402)
    nextn_on_every_head: bool  # every head block carries eh_proj/enorm/hnorm (qwen: the first only)
    split_kv_b: bool = False  # MLA: kv_b_proj becomes k_b_proj and v_b_proj (deepseek.py:433-450)


QWEN = Family("'mtp.' (or 'model.mtp.')", _qwen_head_name, plus_one_norms=True, nextn_on_every_head=False)
NEXTN = Family("'model.layers.{n}.'", _nextn_head_name, plus_one_norms=False, nextn_on_every_head=True)
FAMILIES: dict[str, Family] = {"qwen": QWEN, "nextn": NEXTN, "nextn-mla": replace(NEXTN, split_kv_b=True)}


def family_of(arch: str) -> Family:
    """The family of `arch`'s HF checkpoints (its ArchRecord.hf_family)."""
    rec = record(arch)
    fam = FAMILIES.get(rec.hf_family) if rec is not None and rec.hf_family else None
    if fam is None:
        raise MismatchError(
            f"HF safetensors heads are not supported for trunk arch {arch!r} "
            f"(supported: {', '.join(sorted(HF_HEAD_ARCHS))}); use a GGUF head source"
        )
    return fam


def normalize(name: str) -> str:
    """ModelBase.filter_tensors, base.py:590-600."""
    if name.endswith("e_score_correction_bias"):
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
    return name.replace("language_model.", "")


@dataclass(frozen=True)
class Heads:
    """The MTP tensors of a checkpoint: converted HF-style name -> original name, and the head blocks."""

    renamed: dict[str, str]
    head_bids: list[int]


def _check_head_tensor(cat: Catalog, orig: str, new: str) -> None:
    if orig in cat.missing:
        shard, index = cat.missing[orig]
        raise BadFileError(f"missing shard: {index.name} puts MTP tensor {orig!r} in it", shard)
    if new.endswith(_QUANT_SUFFIXES):
        raise BadFileError(
            f"quantized checkpoint ({orig!r}); FP8/NVFP4/GPTQ heads are not supported, "
            f"use a bf16/f16 checkpoint or a GGUF head source",
            cat.where[orig],
        )
    if ".linear_attn." in new:
        raise MismatchError(
            f"MTP tensor {orig!r} is a linear-attention tensor; only full-attention MTP blocks are supported",
            cat.where[orig],
        )


def select_heads(cat: Catalog, fam: Family, arch: str, n_trunk: int, n_nextn: int | None, where: Path | None) -> Heads:
    """Pick the MTP tensors by name (nothing is read) and rename them converter-style."""
    renamed: dict[str, str] = {}
    found: set[int] = set()
    for orig in list(cat.where) + list(cat.missing):
        r = fam.head_name(normalize(orig), n_trunk)
        if r is None:
            continue
        if isinstance(r, str):
            raise MismatchError(
                f"cannot map MTP tensor {orig!r} (the converter knows mtp.layers.*, mtp.{{{','.join(_QWEN_REMAP)}}}.*)",
                cat.where.get(orig) or where,
            )
        new, i = r
        _check_head_tensor(cat, orig, new)
        renamed[new] = orig
        found.add(i)
    if not renamed:
        raise MismatchError(
            f"no MTP tensors for {arch}: expected names starting with "
            f"{fam.expected.format(n=n_trunk)} in {len(cat.files)} safetensors file(s)"
            f"{_layers_hint(cat, fam, n_trunk)}",
            where,
        )
    n_found = max(found) + 1
    if sorted(found) != list(range(n_found)):
        absent = sorted(set(range(n_found)) - found)
        raise MismatchError(f"MTP layer(s) {absent} missing (found {sorted(found)})", where)
    if n_nextn is not None and n_found != n_nextn:
        raise MismatchError(f"checkpoint has {n_found} MTP layer(s), the trunk expects {n_nextn}", where)
    return Heads(renamed, list(range(n_trunk, n_trunk + n_found)))


def _layers_hint(cat: Catalog, fam: Family, n_trunk: int) -> str:
    if fam.head_name is not _nextn_head_name:
        return ""
    layers = [int(m.group(1)) for n in list(cat.where) + list(cat.missing) if (m := LAYER_RE.match(normalize(n)))]
    if not layers:
        return ""
    return f" (highest layer present: model.layers.{max(layers)}; does the checkpoint match a {n_trunk}-block trunk?)"


def gguf_namer(cat: Catalog, arch: str, heads: Heads, where: Path | None) -> Callable[[str], str]:
    """Converted HF-style name -> GGUF name, through gguf's own tables."""
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tmap = gguf.get_tensor_name_map(arch_enum, heads.head_bids[-1] + 1)
    # NEXTN_* names from gguf's own tables for archs whose MODEL_TENSORS list (gguf 0.19.0) lacks them.
    for t in _NEXTN_TENSORS:
        for bid in heads.head_bids:
            name = gguf.TENSOR_NAMES[t].format(bid=bid)
            tmap.mapping.setdefault(name, (t, name))
            for k in gguf.TensorNameMap.block_mappings_cfg.get(t, ()):
                tmap.mapping.setdefault(k.format(bid=bid), (t, name))

    def gguf_name(hf: str) -> str:
        new = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if new is None:
            orig = heads.renamed.get(hf, hf)
            raise MismatchError(
                f"cannot map MTP tensor {orig!r} (as {hf!r}) to a {arch} GGUF name", cat.where.get(orig) or where
            )
        return new

    return gguf_name
