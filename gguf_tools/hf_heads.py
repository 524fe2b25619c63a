"""MTP head tensors from a Hugging Face safetensors checkpoint, as llama.cpp's converter names and shapes them.

`mtp-cli pack TRUNK.gguf --heads SOURCE` grafts these into a trunk GGUF. SOURCE is a `.safetensors` file,
several files, or a checkpoint directory (with `model.safetensors.index.json`, only the shards that hold
MTP tensors are opened; the others need not even exist). Only the MTP/nextn tensors are read; trunk
tensors are recognised by name and never read.

What this mirrors in llama.cpp's converter (vendored in llama-cpp-python 0.3.36, `conversion/*.py`):

* every arch: `ModelBase.filter_tensors` (base.py:590-600) renames `*e_score_correction_bias` to
  `*e_score_correction.bias` and drops `language_model.`; `prepare_tensors` (base.py:1064-1066) turns
  every dtype other than F16/F32 into F32 (bf16 included) before any transform; HF names are then mapped
  with `gguf.get_tensor_name_map(arch, n_blocks)` (base.py:627).
* qwen35, qwen35moe, qwen3next (`_QwenMtpMixin`, qwen.py:322-339): `model.mtp.*` -> `mtp.*`;
  `mtp.layers.{i}.X` -> `model.layers.{n_trunk+i}.X`; `mtp.fc` / `mtp.pre_fc_norm_embedding` /
  `mtp.pre_fc_norm_hidden` / `mtp.norm` -> `model.layers.{n_trunk}.{eh_proj,enorm,hnorm,shared_head.norm}`.
  `Qwen3NextModel.modify_tensors` (qwen.py:401-402): every `*norm.weight` except `linear_attn.norm`
  gets +1. `Qwen2MoeModel.modify_tensors` (qwen.py:98-145): fused `mlp.experts.down_proj` kept,
  fused `mlp.experts.gate_up_proj` split on dim -2 (first half gate, second half up), per-expert
  `mlp.experts.{x}.{gate,up,down}_proj` stacked over x on a new dim 0.
* glm4moe (`Glm4MoeModel`, glm.py:130-146, 201-236): the nextn layer is `model.layers.{n}` with
  n >= num_hidden_layers, mapped by gguf's own table; per-expert weights stacked as above.
* deepseek2 (`DeepseekV2Model.modify_tensors`, deepseek.py:404-450, nextn layers kept by
  `Glm4MoeLiteModel`, glm.py:284-300): experts stacked; `kv_b_proj` split into `k_b_proj`
  (transposed) and `v_b_proj`.

The installed gguf package (0.19.0) lists NEXTN_* tensors only for glm4moe; for the other archs the
nextn names come from the same gguf tables (`TensorNameMap.block_mappings_cfg[NEXTN_*]`, `TENSOR_NAMES`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from safetensors import SafetensorError, safe_open

from gguf_tools.archs import REQUIRED_NEXTN
from gguf_tools.errors import BadFileError, MismatchError

INDEX_NAME = "model.safetensors.index.json"

# GGUF arch -> name family. "qwen": heads under `mtp.*`; "nextn": heads are `model.layers.{i}` for i >= n_trunk.
_FAMILY = {
    "qwen35": "qwen",
    "qwen35moe": "qwen",
    "qwen3next": "qwen",
    "glm4moe": "nextn",
    "deepseek2": "nextn",
}
HF_HEAD_ARCHS = frozenset(_FAMILY)

# qwen.py:327-332
_QWEN_REMAP = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}

_NEXTN_TENSORS = tuple(t for t in gguf.MODEL_TENSOR if t.name.startswith("NEXTN_"))

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_EXPERTS_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(?:\.weight)?$")
_QUANT_SUFFIXES = ("_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale", ".qweight", ".qzeros", ".scales")

_FLOAT_KEEP = {"F32": np.float32, "F16": np.float16}
_NUMPY_CASTABLE = {"F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}


@dataclass(frozen=True)
class HeadTensor:
    name: str            # GGUF name, e.g. "blk.2.nextn.eh_proj.weight"
    data: np.ndarray     # float32 / float16 (bf16 converted to float32), numpy (row-major) shape = reversed GGUF ne


# --------------------------------------------------------------------------------------------------------------
# Finding files


def _looks_like_safetensors(path: Path) -> bool:
    """8-byte little-endian header length, then a JSON object."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return 8 + int.from_bytes(head[:8], "little") <= size


def _find_index(directory: Path) -> Path | None:
    index = directory / INDEX_NAME
    if index.is_file():
        return index
    others = sorted(directory.glob("*.safetensors.index.json"))
    return others[0] if len(others) == 1 else None


def _load_index(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadFileError(f"unreadable safetensors index ({type(e).__name__}: {e})", index) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BadFileError("safetensors index: weight_map is not a name -> file mapping", index)
    return weight_map


def find_safetensors(source: Path) -> list[Path]:
    """The safetensors files of SOURCE: a `.safetensors` file, an index json, or a directory.

    A directory with `model.safetensors.index.json` yields the shards its weight_map lists that exist on
    disk (a partial download holding only the MTP shards is fine; `read_hf_heads` reports a missing shard
    only if it holds an MTP tensor). Otherwise a directory yields its `*.safetensors` files, sorted.
    """
    source = Path(source)
    if not source.exists():
        raise BadFileError("no such file or directory", source)
    if source.is_dir():
        index = _find_index(source)
        if index is not None:
            return _shards_of_index(index)
        files = sorted(p for p in source.glob("*.safetensors") if p.is_file())
        if not files:
            raise BadFileError(f"directory holds no *.safetensors file and no {INDEX_NAME}", source)
        return files
    if source.name.endswith(".safetensors.index.json"):
        return _shards_of_index(source)
    if not _looks_like_safetensors(source):
        with open(source, "rb") as f:
            magic = f.read(4)
        what = "a GGUF file" if magic == b"GGUF" else "not a safetensors file"
        raise BadFileError(f"{what}; expected a .safetensors file, an index json or a checkpoint directory", source)
    return [source]


def _shards_of_index(index: Path) -> list[Path]:
    shard_names = sorted(set(_load_index(index).values()))
    shards = [index.parent / s for s in shard_names]
    present = [s for s in shards if s.is_file()]
    if not present:
        raise BadFileError(f"none of the {len(shards)} shard(s) listed in the index exists", index)
    return present


def is_safetensors_source(source: Path) -> bool:
    """True if SOURCE looks like something `find_safetensors` accepts (never raises)."""
    source = Path(source)
    try:
        if source.is_dir():
            return _find_index(source) is not None or any(source.glob("*.safetensors"))
        if source.is_file():
            return source.name.endswith(".safetensors.index.json") or _looks_like_safetensors(source)
    except OSError:
        pass
    return False


# --------------------------------------------------------------------------------------------------------------
# Lazy catalog of tensors over many files


class _Catalog:
    """HF tensor name -> file; headers are opened only for files that must be read."""

    def __init__(self, sources: list[Path], stack: ExitStack):
        self._stack = stack
        self.where: dict[str, Path] = {}
        self._from_index: dict[Path, Path] = {}      # file -> index that listed it (names taken from the index)
        self._handles: dict[Path, object] = {}
        self._raw: dict[Path, dict] = {}
        self._keys: dict[Path, frozenset[str]] = {}
        self._index_paths: dict[Path, Path] = {}     # directory -> its index json
        self.missing: dict[str, tuple[Path, Path]] = {}  # name -> (absent shard, index)
        self.files: list[Path] = []

        files: list[Path] = []
        for s in sources:
            files.extend(find_safetensors(Path(s)))
        seen: set[Path] = set()
        indexes: dict[Path, dict[str, str] | None] = {}
        by_shard: dict[Path, dict[str, list[str]]] = {}  # directory -> shard file name -> tensor names
        for f in files:
            key = f.resolve()
            if key in seen:
                continue
            seen.add(key)
            self.files.append(f)
            parent = f.parent
            if parent not in indexes:
                idx = _find_index(parent)
                indexes[parent] = None if idx is None else _load_index(idx)
                by_shard[parent] = {}
                if idx is not None:
                    self._index_paths[parent] = idx
                    for n, shard in indexes[parent].items():
                        by_shard[parent].setdefault(shard, []).append(n)
            listed = by_shard[parent].get(f.name, [])
            if listed:
                self._from_index[f] = self._index_paths[parent]
                names = listed
            else:
                names = sorted(self._keys_of(f))
            for n in names:
                if n in self.where and self.where[n] != f:
                    raise MismatchError(f"tensor {n!r} is also in {self.where[n]}", f)
                self.where[n] = f
        # shards an index lists but that are absent on disk (reported only if they hold MTP tensors)
        for parent, weight_map in indexes.items():
            if weight_map is None:
                continue
            for n, shard in weight_map.items():
                p = parent / shard
                if n not in self.where and not p.is_file():
                    self.missing[n] = (p, self._index_paths[parent])

    def _open(self, path: Path):
        h = self._handles.get(path)
        if h is None:
            if not path.is_file():
                raise BadFileError("no such file", path)
            try:
                # safetensors checks on open that the header's data offsets cover the file exactly, so a
                # truncated (or padded) file fails here, before any tensor is read.
                h = self._stack.enter_context(safe_open(str(path), framework="numpy"))
            except SafetensorError as e:
                raise BadFileError(f"not a valid safetensors file (truncated or corrupt?): {e}", path) from None
            except OSError as e:
                raise BadFileError(f"cannot open: {e}", path) from None
            self._handles[path] = h
            self._check_size(path)
        return h

    def _local(self, path: Path) -> dict:
        local = self._raw.get(path)
        if local is None:
            try:
                local = gguf.utility.SafetensorsLocal(path).tensors
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise BadFileError(f"cannot read safetensors header: {e}", path) from None
            self._raw[path] = local
        return local

    def _check_size(self, path: Path) -> None:
        """The header's data ranges must lie inside the file. safetensors >= 0.8 already refuses such a file
        in `safe_open` ("incomplete metadata, file not fully covered"); this keeps older versions honest."""
        size = path.stat().st_size
        ranges = [t.data_range for t in self._local(path).values()]
        end = max((r.offset + r.size for r in ranges), default=0)
        if end > size:
            raise BadFileError(f"truncated: the header declares tensor data up to byte {end}, "
                               f"the file has {size} bytes", path)

    def _keys_of(self, path: Path) -> frozenset[str]:
        keys = self._keys.get(path)
        if keys is None:
            keys = self._keys[path] = frozenset(self._open(path).keys())
        return keys

    def _slice(self, name: str):
        path = self.where[name]
        h = self._open(path)
        if path in self._from_index and name not in self._keys_of(path):
            raise BadFileError(f"index {self._from_index[path]} puts {name!r} in this file, but it is not there", path)
        return h.get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return str(self._slice(name).get_dtype())

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 or float16 (what the converter keeps, base.py:1064-1066)."""
        return _read_tensor(self, name)

    def raw_bf16(self, name: str) -> np.ndarray:
        """Raw little-endian uint16 words of a BF16 tensor.

        safetensors' numpy framework cannot build a bfloat16 array, and the library exposes no byte ranges;
        gguf's own reader (`gguf.utility.SafetensorsLocal`, the one the converter uses for local files) gives
        the range. The file was already validated by `safe_open` (offsets cover the file exactly).
        """
        path = self.where[name]
        self._open(path)
        t = self._local(path)[name]
        words = t.mmap_bytes().view("<u2")
        if words.size != int(np.prod(t.shape, dtype=np.int64)):
            raise BadFileError(f"tensor {name!r}: {words.size} bf16 values for shape {list(t.shape)}", path)
        return words.reshape(t.shape)


def _read_tensor(cat: _Catalog, name: str) -> np.ndarray:
    dtype = cat.dtype(name)
    if dtype == "BF16":
        words = cat.raw_bf16(name)
        return (words.astype(np.uint32) << 16).view(np.float32)
    try:
        arr = cat._open(cat.where[name]).get_tensor(name)
    except SafetensorError as e:
        raise BadFileError(f"cannot read tensor {name!r}: {e}", cat.where[name]) from None
    if dtype in _FLOAT_KEEP:
        return np.ascontiguousarray(arr, dtype=_FLOAT_KEEP[dtype])
    return np.ascontiguousarray(arr, dtype=np.float32)


# --------------------------------------------------------------------------------------------------------------
# Planning: which HF tensors become which GGUF tensors


@dataclass
class _Step:
    bid: int
    outputs: list[str]                               # GGUF names, in the order `load` returns them
    load: Callable[[], list[np.ndarray]]
    sources: list[str] = field(default_factory=list)


def _normalize(name: str) -> str:
    """ModelBase.filter_tensors, base.py:590-600."""
    if name.endswith("e_score_correction_bias"):
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
    return name.replace("language_model.", "")


def _qwen_head_name(name: str, n_trunk: int) -> tuple[str, int] | None | str:
    """_QwenMtpMixin.filter_tensors, qwen.py:322-339. None: trunk tensor. str: unmappable MTP name."""
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


def _name_map(arch: str, n_blocks: int, head_bids: list[int]) -> gguf.TensorNameMap:
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tmap = gguf.get_tensor_name_map(arch_enum, n_blocks)
    # NEXTN_* names from gguf's own tables for archs whose MODEL_TENSORS list (gguf 0.19.0) lacks them.
    for t in _NEXTN_TENSORS:
        for bid in head_bids:
            gguf_name = gguf.TENSOR_NAMES[t].format(bid=bid)
            tmap.mapping.setdefault(gguf_name, (t, gguf_name))
            for key in gguf.TensorNameMap.block_mappings_cfg.get(t, ()):
                tmap.mapping.setdefault(key.format(bid=bid), (t, gguf_name))
    return tmap


def _plan(cat: _Catalog, arch: str, n_trunk: int, n_nextn: int | None, where: Path | None) -> list[_Step]:
    family = _FAMILY.get(arch)
    if family is None:
        raise MismatchError(
            f"HF safetensors heads are not supported for trunk arch {arch!r} "
            f"(supported: {', '.join(sorted(HF_HEAD_ARCHS))}); use a GGUF head source")
    expected = "'mtp.' (or 'model.mtp.')" if family == "qwen" else f"'model.layers.{n_trunk}.'"

    # 1. pick MTP names (name only: nothing is read) and rename them converter-style.
    renamed: dict[str, str] = {}      # converted HF-style name -> original name
    local_layers: set[int] = set()
    max_layer = -1
    all_names = list(cat.where) + list(cat.missing)
    for orig in all_names:
        name = _normalize(orig)
        if family == "qwen":
            r = _qwen_head_name(name, n_trunk)
            if r is None:
                continue
            if isinstance(r, str):
                raise MismatchError(f"cannot map MTP tensor {orig!r} (the converter knows mtp.layers.*, "
                                    f"mtp.{{{','.join(_QWEN_REMAP)}}}.*)", cat.where.get(orig) or where)
            new, i = r
        else:
            m = _LAYER_RE.match(name)
            if m is None:
                continue
            max_layer = max(max_layer, int(m.group(1)))
            if int(m.group(1)) < n_trunk:
                continue
            new, i = name, int(m.group(1)) - n_trunk
        if orig in cat.missing:
            shard, index = cat.missing[orig]
            raise BadFileError(f"missing shard: {index.name} puts MTP tensor {orig!r} in it", shard)
        if new.endswith(_QUANT_SUFFIXES):
            raise BadFileError(f"quantized checkpoint ({orig!r}); FP8/NVFP4/GPTQ heads are not supported, "
                               f"use a bf16/f16 checkpoint or a GGUF head source", cat.where[orig])
        if ".linear_attn." in new:
            raise MismatchError(f"MTP tensor {orig!r} is a linear-attention tensor; only full-attention MTP "
                                f"blocks are supported", cat.where[orig])
        renamed[new] = orig
        local_layers.add(i)

    if not renamed:
        hint = ""
        if family == "nextn" and max_layer >= 0:
            hint = (f" (highest layer present: model.layers.{max_layer}; "
                    f"does the checkpoint match a {n_trunk}-block trunk?)")
        n_files = len(cat.files)
        raise MismatchError(f"no MTP tensors for {arch}: expected names starting with {expected} in "
                            f"{n_files} safetensors file(s){hint}", where)
    n_found = max(local_layers) + 1
    if sorted(local_layers) != list(range(n_found)):
        absent = sorted(set(range(n_found)) - local_layers)
        raise MismatchError(f"MTP layer(s) {absent} missing (found {sorted(local_layers)})", where)
    if n_nextn is not None and n_found != n_nextn:
        raise MismatchError(f"checkpoint has {n_found} MTP layer(s), the trunk expects {n_nextn}", where)

    head_bids = list(range(n_trunk, n_trunk + n_found))
    tmap = _name_map(arch, n_trunk + n_found, head_bids)

    def gguf_name(hf: str) -> str:
        new = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if new is None:
            orig = renamed.get(hf, hf)
            raise MismatchError(f"cannot map MTP tensor {orig!r} (as {hf!r}) to a {arch} GGUF name",
                                cat.where.get(orig) or where)
        return new

    steps: list[_Step] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}
    for new, orig in renamed.items():
        bid = int(_LAYER_RE.match(new).group(1))
        dtype = cat.dtype(orig)
        if dtype not in _FLOAT_KEEP and dtype != "BF16" and dtype not in _NUMPY_CASTABLE:
            raise BadFileError(f"tensor {orig!r} has dtype {dtype}; only F32/F16/BF16 (and plain ints/F64) are "
                               f"supported (quantized checkpoints are not)", cat.where[orig])

        if m := _EXPERT_RE.match(new):
            experts.setdefault((bid, m.group(3)), {})[int(m.group(2))] = orig
            continue
        if m := _FUSED_EXPERTS_RE.match(new):
            steps.append(_fused_experts_step(cat, bid, m.group(2), new, orig, gguf_name))
            continue
        if ".mlp.experts." in new:
            raise MismatchError(f"unrecognised expert tensor {orig!r}", cat.where[orig])
        if arch == "deepseek2" and new.endswith("kv_b_proj.weight"):
            steps.append(_kv_b_step(cat, bid, new, orig, renamed, gguf_name))
            continue

        # qwen.py:401-402: Qwen3.5/Next RMSNorm weights are stored zero-centred; the converter adds 1.
        plus_one = family == "qwen" and new.endswith("norm.weight") and not new.endswith("linear_attn.norm.weight")
        steps.append(_Step(bid, [gguf_name(new)], _simple_loader(cat, orig, plus_one), [orig]))

    steps.extend(_expert_steps(cat, experts, gguf_name))

    # the nextn tensors the loader requires (archs.REQUIRED_NEXTN); qwen puts them on the first head block only
    produced = {o for s in steps for o in s.outputs}
    check_bids = head_bids if family == "nextn" else head_bids[:1]
    for bid in check_bids:
        for suffix in REQUIRED_NEXTN:
            if f"blk.{bid}.nextn.{suffix}.weight" not in produced:
                raise MismatchError(f"incomplete MTP head: no tensor for blk.{bid}.nextn.{suffix}.weight", where)

    steps.sort(key=lambda s: (s.bid, s.outputs[0]))
    return steps


def _simple_loader(cat: _Catalog, orig: str, plus_one: bool) -> Callable[[], list[np.ndarray]]:
    def load() -> list[np.ndarray]:
        data = cat.read(orig)
        if plus_one:
            data = data + data.dtype.type(1)
        return [data]
    return load


def _fused_experts_step(cat, bid, kind, new, orig, gguf_name) -> _Step:
    """Qwen2MoeModel.modify_tensors, qwen.py:98-117 (transformers-v5 fused expert layout)."""
    shape = cat.shape(orig)
    if kind == "down_proj":
        # HF [n_expert, n_embd, n_ff] -> ne {n_ff, n_embd, n_expert}: kept as is
        name = new if new.endswith(".weight") else f"{new}.weight"
        return _Step(bid, [gguf_name(name)], lambda: [cat.read(orig)], [orig])
    if len(shape) < 3 or shape[-2] % 2 != 0:
        raise MismatchError(f"unexpected gate_up_proj shape {list(shape)} for {orig!r}", cat.where[orig])
    base = new.removesuffix(".weight").removesuffix(".gate_up_proj")
    outs = [gguf_name(f"{base}.gate_proj.weight"), gguf_name(f"{base}.up_proj.weight")]

    def load() -> list[np.ndarray]:
        data = cat.read(orig)
        n_ff = data.shape[-2] // 2
        return [np.ascontiguousarray(data[..., :n_ff, :]), np.ascontiguousarray(data[..., n_ff:, :])]
    return _Step(bid, outs, load, [orig])


def _expert_steps(cat, experts: dict[tuple[int, str], dict[int, str]], gguf_name) -> list[_Step]:
    """Per-expert weights stacked on a new dim 0, expert 0 first (qwen.py:119-143, glm.py:207-232,
    deepseek.py:404-431): gate/up [n_ff, n_embd] -> [n_expert, n_ff, n_embd] = ne {n_embd, n_ff, n_expert}."""
    steps = []
    by_bid: dict[int, dict[str, dict[int, str]]] = {}
    for (bid, w), xs in experts.items():
        by_bid.setdefault(bid, {})[w] = xs
    for bid, ws in sorted(by_bid.items()):
        n_expert = 1 + max(x for xs in ws.values() for x in xs)
        for w in ("down_proj", "gate_proj", "up_proj"):
            xs = ws.get(w, {})
            absent = [x for x in range(n_expert) if x not in xs]
            if absent:
                raise MismatchError(f"layer {bid}: expert {w} missing for expert(s) {absent[:8]} "
                                    f"of {n_expert}", cat.where[next(iter(xs.values()))] if xs else None)
            names = [xs[x] for x in range(n_expert)]
            shapes = {cat.shape(n) for n in names}
            if len(shapes) != 1:
                raise MismatchError(f"layer {bid}: expert {w} shapes differ: {sorted(shapes)}", cat.where[names[0]])
            steps.append(_Step(bid, [gguf_name(f"model.layers.{bid}.mlp.experts.{w}.weight")],
                               _stack_loader(cat, names), names))
    return steps


def _stack_loader(cat: _Catalog, names: list[str]) -> Callable[[], list[np.ndarray]]:
    def load() -> list[np.ndarray]:
        out = None
        for i, n in enumerate(names):
            a = cat.read(n)
            if out is None:
                out = np.empty((len(names),) + a.shape, dtype=a.dtype)
            elif a.dtype != out.dtype:           # mixed f16/f32 experts: widen like torch.stack would
                out = out.astype(np.result_type(out.dtype, a.dtype))
            out[i] = a
        return [out]
    return load


def _mla_dims(cat: _Catalog, new: str, orig: str, renamed: dict[str, str]) -> tuple[int, int, int]:
    """(n_head_kv, qk_nope_head_dim, v_head_dim) for kv_b_proj, from config.json if present, else the layer's shapes."""
    rows, kv_lora = cat.shape(orig)[:2]
    cfg_path = cat.where[orig].parent / "config.json"
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            hp = {**cfg, **cfg.get("text_config", {})}
            n_kv = hp.get("num_key_value_heads") or hp["num_attention_heads"]
            nope, v = int(hp["qk_nope_head_dim"]), int(hp["v_head_dim"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        else:
            if rows != n_kv * (nope + v):            # deepseek.py:442
                raise MismatchError(f"{orig!r} has {rows} rows, config.json says "
                                    f"{n_kv} heads x ({nope} + {v})", cat.where[orig])
            return int(n_kv), nope, v
    # n_head*(nope+rope) = q rows (A), n_head*v = o_proj cols (B), n_head*(nope+v) = kv_b rows (C),
    # kv_lora + rope = kv_a_proj_with_mqa rows  =>  n_head = (A - C + B) / rope
    prefix = new.removesuffix("kv_b_proj.weight")
    def shape_of(suffix: str):
        o = renamed.get(prefix + suffix)
        return None if o is None else cat.shape(o)
    q = shape_of("q_b_proj.weight") or shape_of("q_proj.weight")
    o = shape_of("o_proj.weight")
    kv_a = shape_of("kv_a_proj_with_mqa.weight")
    if q is None or o is None or kv_a is None:
        raise MismatchError(f"cannot split {orig!r}: no config.json next to it and the layer lacks "
                            f"q_b_proj/q_proj, o_proj or kv_a_proj_with_mqa to infer head dims", cat.where[orig])
    rope = kv_a[0] - kv_lora
    a, b, c = q[0], o[1], rows
    if rope <= 0 or (a - c + b) <= 0 or (a - c + b) % rope:
        raise MismatchError(f"cannot infer MLA head dims for {orig!r} from shapes", cat.where[orig])
    n_head = (a - c + b) // rope
    if (c - b) % n_head or b % n_head or (c - b) <= 0 or b <= 0:
        raise MismatchError(f"cannot infer MLA head dims for {orig!r} from shapes", cat.where[orig])
    return n_head, (c - b) // n_head, b // n_head


def _kv_b_step(cat, bid, new, orig, renamed, gguf_name) -> _Step:
    """DeepseekV2Model.modify_tensors, deepseek.py:433-450: kv_b [n_head*(nope+v), kv_lora] ->
    k_b [n_head, kv_lora, nope] (ne {nope, kv_lora, n_head}) and v_b [n_head, v, kv_lora] (ne {kv_lora, v, n_head})."""
    n_head, nope, v = _mla_dims(cat, new, orig, renamed)
    outs = [gguf_name(new.replace("kv_b_proj", "k_b_proj")), gguf_name(new.replace("kv_b_proj", "v_b_proj"))]

    def load() -> list[np.ndarray]:
        data = cat.read(orig)
        kv_b = data.reshape(n_head, nope + v, data.shape[-1])
        k_b = np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))
        v_b = np.ascontiguousarray(kv_b[:, nope:, :])
        return [k_b, v_b]
    return _Step(bid, outs, load, [orig])


# --------------------------------------------------------------------------------------------------------------
# Public entry points


def iter_hf_heads(sources: list[Path], arch: str, n_trunk: int, n_nextn: int | None = None) -> Iterator[HeadTensor]:
    """Like `read_hf_heads`, one tensor at a time (all checks on names, shapes and dtypes run first)."""
    if isinstance(sources, (str, Path)):
        sources = [sources]
    sources = [Path(s) for s in sources]
    if not sources:
        raise BadFileError("no head source given")
    parents = {s.parent for s in sources}
    where = sources[0] if len(sources) == 1 else (parents.pop() if len(parents) == 1 else None)
    with ExitStack() as stack:
        cat = _Catalog(sources, stack)
        steps = _plan(cat, arch, n_trunk, n_nextn, where)
        for step in steps:
            arrays = step.load()
            for name, data in zip(step.outputs, arrays, strict=True):
                yield HeadTensor(name, data)


def read_hf_heads(sources: list[Path], arch: str, n_trunk: int, n_nextn: int | None = None) -> list[HeadTensor]:
    """The MTP head tensors of a HF safetensors checkpoint, as llama.cpp's converter would write them for a
    trunk of ARCH with N_TRUNK blocks (head blocks are `blk.{n_trunk}` ...). SOURCES are files or directories.
    N_NEXTN, if given, is the number of head blocks the checkpoint must hold. Sorted by block, then name."""
    return list(iter_hf_heads(sources, arch, n_trunk, n_nextn))
