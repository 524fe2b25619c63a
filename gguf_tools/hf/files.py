"""Finding and reading a Hugging Face safetensors checkpoint: files, shard indexes, a lazy tensor catalog.

SOURCE is a `.safetensors` file, several files, or a checkpoint directory (with
`model.safetensors.index.json`, only the shards that hold MTP tensors are opened; the others need
not even exist). Tensors are read as the converter keeps them: F16/F32 as they are, every other
dtype (bf16 included) as F32 (`prepare_tensors`, base.py:1064-1066).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors import SafetensorError, safe_open

from gguf_tools.errors import BadFileError, MismatchError

INDEX_NAME = "model.safetensors.index.json"
FLOAT_KEEP = {"F32": np.float32, "F16": np.float16}
NUMPY_CASTABLE = {"F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}


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


class Catalog:
    """HF tensor name -> file; headers are opened only for files that must be read."""

    def __init__(self, sources: list[Path], stack: ExitStack):
        self._stack = stack
        self.where: dict[str, Path] = {}
        self._from_index: dict[Path, Path] = {}  # file -> index that listed it (names taken from the index)
        self._handles: dict[Path, Any] = {}
        self._raw: dict[Path, dict] = {}
        self._keys: dict[Path, frozenset[str]] = {}
        self._index_paths: dict[Path, Path] = {}  # directory -> its index json
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
                weight_map = indexes[parent] = None if idx is None else _load_index(idx)
                by_shard[parent] = {}
                if idx is not None and weight_map is not None:
                    self._index_paths[parent] = idx
                    for n, shard in weight_map.items():
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
            raise BadFileError(
                f"truncated: the header declares tensor data up to byte {end}, the file has {size} bytes", path
            )

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
        dtype = self.dtype(name)
        if dtype == "BF16":
            words = self.raw_bf16(name)
            return (words.astype(np.uint32) << 16).view(np.float32)
        try:
            arr = self._open(self.where[name]).get_tensor(name)
        except SafetensorError as e:
            raise BadFileError(f"cannot read tensor {name!r}: {e}", self.where[name]) from None
        if dtype in FLOAT_KEEP:
            return np.ascontiguousarray(arr, dtype=FLOAT_KEEP[dtype])
        return np.ascontiguousarray(arr, dtype=np.float32)

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
