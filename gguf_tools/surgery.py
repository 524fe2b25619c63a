"""Plan head surgery on GGUF files: pack (graft heads), strip (drop them), extract (heads only).

Planning validates everything before a byte is written; `gguf_write.write_gguf` then streams the
plan. Trunk tensors are always `FileTensor`s: their bytes are copied, never decoded.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, quants

from gguf_tools.errors import BadFileError, MismatchError, RefusedError
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.gguf_write import KV, ArrayTensor, FileTensor, Tensor, WritePlan
from gguf_tools.names import (
    ADOPTABLE_ARCHS,
    ASSISTANT_ARCHS,
    ASSISTANT_FOR,
    FLOAT_TYPES,
    HEAD_TYPES,
    MATCH_KEYS,
    MTP_ARCHS,
    PER_LAYER_KEYS,
    SIDECAR_SHARED,
    block_index,
    block_suffix,
    key,
    nextn_shapes,
    rename_block,
)
from gguf_tools.prescan import ArrayValue, TensorEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackOptions:
    head_type: str = "keep"  # keep | f32 | f16 | bf16 | q8_0
    replace: bool = False  # drop a head the trunk already has
    force: bool = False  # graft despite a vocabulary mismatch


# ---- reading a file's layout -------------------------------------------------------------------


def head_tensors(gf: GGUFFile) -> list[TensorEntry]:
    """Tensors in the file's head blocks (block index >= n_trunk)."""
    n_trunk = gf.layout().n_trunk
    return [t for t in gf.tensors.values() if (i := block_index(t.name)) is not None and i >= n_trunk]


def trunk_tensors(gf: GGUFFile) -> list[TensorEntry]:
    n_trunk = gf.layout().n_trunk
    return [t for t in gf.tensors.values() if (i := block_index(t.name)) is None or i < n_trunk]


# ---- key-values --------------------------------------------------------------------------------


def copy_kvs(gf: GGUFFile) -> list[KV]:
    """Every key-value in file order, each carrying its encoded bytes so an unchanged one is copied
    verbatim; string arrays (vocabularies) stay undecoded ArrayValues, decoded only if iterated."""
    out, raw = [], gf.raw_values()
    for name, vtype in gf.scan.types.items():
        v = gf.scan.values[name]
        if isinstance(v, ArrayValue):
            value, sub = (v if v.etype == GGUFValueType.STRING else v.contents()), v.etype
        else:
            value, sub = v, None
        out.append(KV(name, value, vtype, sub, raw=raw[name]))
    return out


def _set_kv(kvs: list[KV], name: str, value: int, after: str) -> list[KV]:
    """Set a uint32 key in place, or insert it right after `after`."""
    for i, kv in enumerate(kvs):
        if kv.key == name:
            kvs[i] = KV(name, value, kv.type)
            return kvs
    idx = next((i + 1 for i, kv in enumerate(kvs) if kv.key == after), len(kvs))
    kvs.insert(idx, KV(name, value, GGUFValueType.UINT32))
    return kvs


def _resize_layer_arrays(
    kvs: list[KV], arch: str, old_n: int, new_n: int, donor: dict[str, KV] | None, new_head: bool
) -> list[KV]:
    """Per-layer arrays follow the block count: truncate, or extend from the donor's entries (a new
    head block, which has no source: like the trunk's last block)."""
    names = {key(arch, k) for k in PER_LAYER_KEYS}
    out = []
    for kv in kvs:
        if kv.key in names and kv.type == GGUFValueType.ARRAY and len(kv.value) == old_n:
            value = list(kv.value)
            if new_n < old_n:
                value = value[:new_n]
            else:
                d = donor.get(kv.key) if donor else None
                if d is not None and len(d.value) >= new_n:
                    value += list(d.value)[old_n:new_n]
                else:  # no donor entry: a head block is a dense attention block, like the trunk's last
                    fill = False if kv.key.endswith("recurrent_layers") else value[-1]
                    if not new_head:
                        log.warning("%s: no value for the head block in the source; using %r", kv.key, fill)
                    value += [fill] * (new_n - old_n)
            kv = KV(kv.key, value, kv.type, kv.sub_type)
        out.append(kv)
    return out


def layout_kvs(
    kvs: list[KV],
    arch: str,
    old_blocks: int,
    n_trunk: int,
    n_heads: int,
    donor: dict[str, KV] | None = None,
    new_head: bool = False,
) -> list[KV]:
    """`kvs` for n_trunk + n_heads blocks: block_count, nextn_predict_layers right after it (or
    dropped), per-layer arrays resized (from the donor's entries; `new_head`: a head made here, like
    the trunk's last block). Pack, strip, adopt's head slot and train's sidecar all lay keys out so."""
    kvs = _resize_layer_arrays(kvs, arch, old_blocks, n_trunk + n_heads, donor, new_head)
    kvs = _set_kv(kvs, key(arch, "block_count"), n_trunk + n_heads, after="")
    if n_heads:
        return _set_kv(kvs, key(arch, "nextn_predict_layers"), n_heads, after=key(arch, "block_count"))
    return [kv for kv in kvs if kv.key != key(arch, "nextn_predict_layers")]


def _layout_kvs(gf: GGUFFile, n_trunk: int, n_heads: int, donor: dict[str, KV] | None) -> list[KV]:
    return layout_kvs(copy_kvs(gf), gf.arch, gf.layout().block_count, n_trunk, n_heads, donor)


def _file_tensor(gf: GGUFFile, t: TensorEntry, name: str | None = None) -> FileTensor:
    return FileTensor(name or t.name, t.type, t.shape, t.n_bytes, gf.path, t.offset)


# ---- strip and extract -------------------------------------------------------------------------


def _require_head(gf: GGUFFile) -> list[TensorEntry]:
    heads = head_tensors(gf)
    if gf.layout().nextn_layers == 0 or not heads:
        raise RefusedError(
            f"has no MTP head ({gf.arch}.nextn_predict_layers is "
            f"{gf.layout().nextn_layers}, {len(heads)} head tensors)",
            gf.path,
        )
    return heads


def plan_strip(gf: GGUFFile) -> WritePlan:
    """The trunk alone: head blocks dropped, block_count and per-layer arrays shrunk."""
    _require_head(gf)
    if not gf.has_trunk:
        raise RefusedError("is an MTP-only sidecar: it has no trunk to keep", gf.path)
    n_trunk = gf.layout().n_trunk
    tensors = [_file_tensor(gf, t) for t in trunk_tensors(gf)]
    return WritePlan(gf.arch, gf.alignment, with_size_label(_layout_kvs(gf, n_trunk, 0, None), tensors), tensors)


def plan_extract(gf: GGUFFile, head_only: bool = False) -> WritePlan:
    """An MTP-only sidecar: head blocks plus the shared tensors llama.cpp's loader requires; with
    `head_only` the head blocks alone (not loadable by llama.cpp, but a pack source a fraction of the
    size: the shared tensors are the trunk's anyway)."""
    heads = _require_head(gf)
    shared = [] if head_only else [gf.tensors[n] for n in SIDECAR_SHARED if n in gf.tensors]
    tensors = [_file_tensor(gf, t) for t in shared + heads]
    return WritePlan(gf.arch, gf.alignment, copy_kvs(gf), tensors)


# ---- pack --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadSet:
    """Head tensors from some source, named for blocks starting at `first_block` of the source."""

    origin: Path
    first_block: int
    n_blocks: int
    tensors: Sequence[Tensor]
    kvs: dict[str, KV] | None = None  # the source's key-values, when it is a GGUF
    tokens: list[bytes] | None = None
    n_vocab: int | None = None


def heads_from_gguf(src: GGUFFile) -> HeadSet:
    """Take only the head blocks of a donor (trunk + head) or an MTP-only sidecar GGUF."""
    if src.arch in ASSISTANT_ARCHS:
        raise RefusedError(
            f"is a {src.arch} drafter, not an MTP head: give it as the draft model (`draft_model`) "
            "instead of packing it",
            src.path,
        )
    heads = _require_head(src)
    lay = src.layout()
    return HeadSet(
        src.path,
        lay.n_trunk,
        lay.nextn_layers,
        [_file_tensor(src, t) for t in heads],
        {kv.key: kv for kv in copy_kvs(src)},
        src.token_bytes(),
        src.n_vocab(),
    )


def plan_pack(trunk: GGUFFile, heads: HeadSet, opts: PackOptions = PackOptions()) -> WritePlan:
    """Trunk tensors byte for byte, then the heads renumbered after the trunk's last block."""
    arch = trunk.arch
    if arch not in MTP_ARCHS:
        hint = f" (adopt re-expresses {'/'.join(ADOPTABLE_ARCHS)} as glm4moe)" if arch in ADOPTABLE_ARCHS else ""
        if arch in ASSISTANT_FOR:
            hint = f"; it drafts with a separate {ASSISTANT_FOR[arch]} model, given as `draft_model`"
        raise RefusedError(
            f"llama.cpp has no MTP graph for architecture {arch!r}: a head packed into it would never run{hint}",
            trunk.path,
        )
    own_heads = head_tensors(trunk)
    if own_heads and not opts.replace:
        raise RefusedError(f"already has an MTP head ({len(own_heads)} tensors; `replace` swaps it)", trunk.path)
    n_trunk = trunk.layout().n_trunk
    _check_compatible(trunk, heads, n_trunk, opts)
    renamed = [_renumber(t, heads.first_block, n_trunk) for t in heads.tensors]
    _check_head_shapes(trunk, renamed)
    renamed = [convert_head_tensor(t, opts.head_type) for t in renamed]
    tensors: list[Tensor] = [_file_tensor(trunk, t) for t in trunk_tensors(trunk)]
    names = {t.name for t in tensors}
    for t in renamed:
        if t.name in names:
            raise MismatchError(f"tensor {t.name!r} would appear twice in the output", heads.origin)
        names.add(t.name)
        tensors.append(t)
    kvs = _layout_kvs(trunk, n_trunk, heads.n_blocks, heads.kvs)
    return WritePlan(arch, trunk.alignment, with_size_label(kvs, tensors), tensors)


def with_size_label(kvs: list[KV], tensors: Sequence[Tensor]) -> list[KV]:
    """general.size_label recomputed from the tensors written, as llama.cpp's converter computes it
    (gguf_writer.get_total_parameter_count); only where the source has one."""
    if not any(kv.key == gguf.Keys.General.SIZE_LABEL for kv in kvs):
        return kvs
    total = shared = expert = n_expert_tensors = expert_sum = 0
    for t in tensors:
        size = math.prod(t.shape)
        total += size
        if "_exps." in t.name and len(t.shape) >= 3:
            count = t.shape[1 if ".bias" in t.name else 2]  # (ggml order: the expert axis)
            expert, expert_sum, n_expert_tensors = expert + size // count, expert_sum + count, n_expert_tensors + 1
        else:
            shared += size
    label = gguf.size_label(total, shared, expert, expert_sum // n_expert_tensors if n_expert_tensors else 0)
    return [KV(kv.key, label, GGUFValueType.STRING) if kv.key == gguf.Keys.General.SIZE_LABEL else kv for kv in kvs]


def _renumber(t: Tensor, first_block: int, n_trunk: int) -> Tensor:
    i = block_index(t.name)
    if i is None or i < first_block:
        raise MismatchError(f"head tensor {t.name!r} is not in a head block (>= {first_block})")
    name = rename_block(t.name, n_trunk + i - first_block)
    return dataclasses.replace(t, name=name)


def _check_compatible(trunk: GGUFFile, heads: HeadSet, n_trunk: int, opts: PackOptions) -> None:
    src = heads.origin
    if heads.kvs is not None:
        src_arch = heads.kvs["general.architecture"].value
        if src_arch != trunk.arch:
            raise MismatchError(
                f"architecture {src_arch!r} does not match the trunk's {trunk.arch!r} ({trunk.path})", src
            )
        if heads.first_block != n_trunk:
            raise MismatchError(
                f"its head follows {heads.first_block} trunk blocks, the trunk has {n_trunk} ({trunk.path})", src
            )
        for k in MATCH_KEYS:
            a, b = trunk.get(key(trunk.arch, k)), heads.kvs.get(key(trunk.arch, k))
            if a is not None and b is not None and _scalar(a) != _scalar(b.value):
                raise MismatchError(f"{key(trunk.arch, k)} is {b.value!r}, the trunk's is {a!r} ({trunk.path})", src)
    if heads.n_vocab is not None and trunk.n_vocab() is not None and heads.n_vocab != trunk.n_vocab():
        raise MismatchError(f"vocabulary has {heads.n_vocab} tokens, the trunk's {trunk.n_vocab()} ({trunk.path})", src)
    ta, tb = trunk.token_bytes(), heads.tokens
    if ta is not None and tb is not None and ta != tb:
        first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        msg = f"vocabulary differs from the trunk's ({trunk.path}) first at token {first}"
        if not opts.force:
            raise MismatchError(msg + " (`force` grafts anyway)", src)
        log.warning("forced: %s: %s", src, msg)


def _scalar(v: object) -> object:
    """Compare floats at float32 precision (the file stores float32)."""
    return float(np.float32(v)) if isinstance(v, float) else v


def _check_head_shapes(trunk: GGUFFile, tensors: Sequence[Tensor]) -> None:
    """Shapes llama.cpp will demand: nextn tensors from n_embd/n_vocab (qwen35.cpp, glm4-moe.cpp), the
    rest from the trunk."""
    n_embd, n_vocab = trunk.arch_get("embedding_length"), trunk.n_vocab()
    expect = nextn_shapes(n_embd, n_vocab) if isinstance(n_embd, int) and n_vocab is not None else {}
    # A head block's ordinary tensors have the shapes of the trunk's latest block with the same tensor.
    latest: dict[str, TensorEntry] = {}
    for e in trunk_tensors(trunk):
        if block_index(e.name) is not None:
            latest[block_suffix(e.name)] = e
    for t in tensors:
        suffix = block_suffix(t.name)
        want = expect.get(suffix)
        if want is not None and tuple(t.shape) != want:
            raise MismatchError(f"head tensor {t.name} has shape {list(t.shape)}, the trunk needs {list(want)}")
        same = latest.get(suffix)
        if same is not None and tuple(t.shape) != tuple(same.shape):
            raise MismatchError(
                f"head tensor {t.name} has shape {list(t.shape)}, the trunk's {same.name} has {list(same.shape)}"
            )


# ---- head type conversion ----------------------------------------------------------------------


def convert_head_tensor(t: Tensor, head_type: str) -> Tensor:
    """Convert a float head tensor to the requested type; norms (1-D) stay F32, quantized stay as they are."""
    if isinstance(t, FileTensor) and (head_type == "keep" or t.type not in FLOAT_TYPES):
        if head_type != "keep" and t.type not in FLOAT_TYPES:
            log.info("%s is %s: kept as is (re-quantizing would lose precision)", t.name, t.type.name)
        return t
    data = _load_f32(t)
    if len(t.shape) == 1 or not t.name.endswith(".weight") or ".ffn_gate_inp" in t.name:
        target = GGMLQuantizationType.F32  # as llama.cpp's converter: norms, biases and routers stay F32
    elif head_type == "keep":
        target = t.type if isinstance(t, ArrayTensor) else GGMLQuantizationType.F32
    else:
        if head_type not in HEAD_TYPES:
            raise RefusedError(f"unknown head type {head_type!r} (keep, {', '.join(HEAD_TYPES)})")
        target = HEAD_TYPES[head_type]
    block = GGML_QUANT_SIZES[target][0]
    if t.shape[0] % block:  # as llama.cpp's converter does with a QuantError
        log.warning("%s: first dimension %d is not a multiple of %d; falling back to F16", t.name, t.shape[0], block)
        target = GGMLQuantizationType.F16
    if isinstance(t, ArrayTensor) and t.type == target and target != GGMLQuantizationType.BF16:
        return t
    return ArrayTensor(t.name, target, t.shape, quants.quantize(data, target))


def _load_f32(t: Tensor) -> np.ndarray:
    shape = tuple(reversed(t.shape))
    if isinstance(t, ArrayTensor) and t.data.dtype != np.uint8:
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    if isinstance(t, ArrayTensor):
        raw = t.data
    else:
        raw = np.fromfile(t.path, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        if raw.size != t.n_bytes:
            raise BadFileError(f"file ends inside tensor {t.name!r}", t.path)
    return np.asarray(quants.dequantize(raw, t.type), dtype=np.float32).reshape(shape)
