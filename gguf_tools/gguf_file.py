"""Open a GGUF file safely: bounds-check its header against the real file size, then read it with gguf.

`gguf.GGUFReader` and llama.cpp's loader both trust the counts, lengths and offsets a file declares;
a hostile or truncated file can make them loop for ever, allocate without bound or read past the end.
`prescan` walks the header with those numbers capped by the bytes actually left, and only then
does `open_gguf` hand the file to `GGUFReader`.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, quants

from gguf_tools.errors import BadFileError
from gguf_tools.names import OUTPUT, TOKEN_EMBD, TRUNK_MARKER, BlockLayout, block_index, key

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_NESTING = 4  # arrays of arrays; real files use at most 1 level
_SCALAR_FMT = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_VALUE_TYPES = {int(t) for t in GGUFValueType}
_TENSOR_TYPES = {int(t) for t in GGML_QUANT_SIZES}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the file declares it; `offset` is absolute in the file."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: ne0 (the contiguous dimension) first
    n_bytes: int
    offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ArrayValue:
    """An array key-value as the prescan saw it: only its length (the reader decodes the items)."""

    count: int


@dataclass(frozen=True)
class Prescan:
    """What the header declares, checked against the file size."""

    version: int
    byteorder: str  # "<" or ">"
    alignment: int
    data_start: int
    values: dict[str, Any]  # scalars and strings as read; arrays as ArrayValue
    tensors: tuple[TensorEntry, ...]


class _Cursor:
    """Bounds-checked reads over a mapped file; every failure names what was being read."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path, byteorder: str = "<"):
        self.buf, self.path, self.pos, self.bo = buf, path, 0, byteorder
        self.size = len(buf)

    def fail(self, what: str) -> BadFileError:
        return BadFileError(f"not a valid GGUF: {what} (at byte {self.pos} of {self.size})", self.path)

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining():
            raise self.fail(f"{what} runs past the end of the file ({n} bytes declared)")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(out)

    def unpack(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        if size > self.remaining():
            raise self.fail(f"file ends inside {what}")
        (value,) = struct.unpack_from(self.bo + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.unpack("Q", f"the length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def skip_value(self, vtype: int, what: str, depth: int = 0) -> Any:
        """Read one value: a scalar or string as itself, an array as ArrayValue(count)."""
        if vtype not in _VALUE_TYPES:
            raise self.fail(f"{what} has unknown value type {vtype}")
        vt = GGUFValueType(vtype)
        if vt == GGUFValueType.STRING:
            return self.string(what)
        if vt != GGUFValueType.ARRAY:
            return self.unpack(_SCALAR_FMT[vt], what)
        if depth >= MAX_NESTING:
            raise self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        etype = self.unpack("I", f"the element type of {what}")
        count = self.unpack("Q", f"the length of {what}")
        if etype not in _VALUE_TYPES:
            raise self.fail(f"{what} has unknown element type {etype}")
        et = GGUFValueType(etype)
        if et in _SCALAR_FMT:
            self.take(count * struct.calcsize(_SCALAR_FMT[et]), f"{what} ({count} elements)")
            return ArrayValue(count)
        # Each string or array element takes at least 8 bytes: cap the count before looping over it.
        if count * 8 > self.remaining():
            raise self.fail(f"{what} declares {count} elements, more than the file can hold")
        for _ in range(count):
            self.skip_value(etype, what, depth + 1)
        return ArrayValue(count)


def prescan(path: Path) -> Prescan:
    """Validate the structure of a GGUF file without trusting any count, length or offset in it."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise BadFileError(f"not a GGUF file: only {size} bytes", path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _prescan(_Cursor(buf, path))


def _prescan(cur: _Cursor) -> Prescan:
    if cur.take(4, "magic") != GGUF_MAGIC:
        raise BadFileError("not a GGUF file (bad magic)", cur.path)
    version = cur.unpack("I", "the version")
    if version & 0xFFFF == 0:  # written big-endian
        cur.bo = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in (2, 3):
        raise cur.fail(f"unsupported GGUF version {version} (2 and 3 are supported)")
    n_tensors = cur.unpack("Q", "the tensor count")
    n_kv = cur.unpack("Q", "the key-value count")
    # A key-value takes at least 13 bytes, a tensor info at least 24.
    if n_kv * 13 + n_tensors * 24 > cur.remaining():
        raise cur.fail(f"declares {n_kv} key-values and {n_tensors} tensors, more than the file can hold (truncated?)")

    values: dict[str, Any] = {}
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        name = cur.string(f"key #{i}")
        if name in values:
            raise cur.fail(f"key {name!r} appears twice")
        vtype = cur.unpack("I", f"the type of key {name!r}")
        value = values[name] = cur.skip_value(vtype, f"key {name!r}")
        if name == gguf.Keys.General.ALIGNMENT:
            if vtype != GGUFValueType.UINT32 or not value or value & (value - 1):
                raise cur.fail(f"general.alignment must be a power-of-two uint32, got {value!r}")
            alignment = value

    infos = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"the name of tensor #{i}")
        if name in names:
            raise cur.fail(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = cur.unpack("I", f"the rank of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(cur.unpack("Q", f"the shape of tensor {name!r}") for _ in range(n_dims))
        ttype = cur.unpack("I", f"the type of tensor {name!r}")
        offset = cur.unpack("Q", f"the offset of tensor {name!r}")
        infos.append((name, shape, ttype, offset))

    data_start = -(-cur.pos // alignment) * alignment
    tensors = tuple(_check_tensor(cur, data_start, alignment, *info) for info in infos)
    _check_overlaps(cur, tensors)
    return Prescan(version, cur.bo, alignment, data_start, values, tensors)


def _check_tensor(
    cur: _Cursor, data_start: int, alignment: int, name: str, shape: tuple[int, ...], ttype: int, offset: int
) -> TensorEntry:
    if ttype not in _TENSOR_TYPES:
        raise cur.fail(f"tensor {name!r} has unknown type {ttype}")
    qtype = GGMLQuantizationType(ttype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if any(d == 0 for d in shape):
        raise cur.fail(f"tensor {name!r} has a zero dimension {list(shape)}")
    if shape[0] % block:
        raise cur.fail(
            f"tensor {name!r}: first dimension {shape[0]} is not a multiple of {qtype.name}'s block of {block}"
        )
    n_bytes = shape[0] // block * type_size
    for d in shape[1:]:
        n_bytes *= d
        if n_bytes > cur.size:  # stop before the product grows without bound
            break
    if offset % alignment:
        raise cur.fail(f"tensor {name!r} offset {offset} is not aligned to {alignment}")
    end = data_start + offset + n_bytes
    if end > cur.size:
        raise BadFileError(
            f"truncated or corrupt GGUF: tensor {name!r} ends at byte {end}, "
            f"past the end of the file ({cur.size} bytes)",
            cur.path,
        )
    return TensorEntry(name, qtype, shape, n_bytes, data_start + offset)


def _check_overlaps(cur: _Cursor, tensors: tuple[TensorEntry, ...]) -> None:
    by_offset = sorted(tensors, key=lambda t: t.offset)
    for a, b in zip(by_offset, by_offset[1:]):
        if a.offset + a.n_bytes > b.offset:
            raise cur.fail(f"tensors {a.name!r} and {b.name!r} overlap")


class GGUFFile:
    """A validated GGUF: tensors by name (file order), scalar keys from the prescan, and the gguf
    reader for arrays and copying, created on first use (it decodes every array item, which takes
    seconds on a large vocabulary)."""

    def __init__(self, path: Path, size: int, scan: Prescan):
        self.path, self.size, self.scan = path, size, scan
        self.tensors: dict[str, TensorEntry] = {t.name: t for t in scan.tensors}

    @functools.cached_property
    def reader(self) -> GGUFReader:
        try:
            return GGUFReader(self.path, "r")
        except OSError as e:
            raise BadFileError(f"cannot read: {e.strerror or e}", self.path) from None
        except Exception as e:  # the prescan should catch everything; the reader is the second line of defence
            raise BadFileError(f"not a valid GGUF: {e}", self.path) from None

    @property
    def arch(self) -> str:
        return self.get(gguf.Keys.General.ARCHITECTURE, "")

    @property
    def alignment(self) -> int:
        return self.scan.alignment

    def has(self, name: str) -> bool:
        return name in self.scan.values

    def get(self, name: str, default: Any = None) -> Any:
        v = self.scan.values.get(name, default)
        if not isinstance(v, ArrayValue):
            return v
        return self.reader.fields[name].contents()

    def arch_get(self, name: str, default: Any = None) -> Any:
        return self.get(key(self.arch, name), default)

    def fields(self) -> Iterator[gguf.ReaderField]:
        """Real key-values in file order (the reader's virtual GGUF.* fields left out)."""
        return (f for f in self.reader.fields.values() if not f.name.startswith("GGUF."))

    def layout(self) -> BlockLayout:
        blocks = self.arch_get("block_count", 0)
        nextn = self.arch_get("nextn_predict_layers", 0)
        if not isinstance(blocks, int) or not isinstance(nextn, int) or not 0 <= nextn <= blocks:
            raise BadFileError(
                f"inconsistent {self.arch}.block_count={blocks!r} / nextn_predict_layers={nextn!r}", self.path
            )
        return BlockLayout(blocks, nextn)

    @property
    def has_trunk(self) -> bool:
        """True if any trunk block (index < n_trunk) has a tensor here."""
        n_trunk = self.layout().n_trunk
        return any((i := block_index(t)) is not None and i < n_trunk for t in self.tensors)

    @property
    def is_mtp_sidecar(self) -> bool:
        """Head blocks and no trunk, as llama.cpp's loader decides (no blk.0.attn_norm.weight)."""
        return self.layout().nextn_layers > 0 and TRUNK_MARKER not in self.tensors

    @property
    def output_name(self) -> str:
        """The output matrix's tensor: `output.weight`, or the token embedding it is tied to."""
        return OUTPUT if OUTPUT in self.tensors else TOKEN_EMBD

    def read_f32(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 in numpy order (dequantized)."""
        t = self.tensors[name]
        raw = np.fromfile(self.path, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
        if raw.size != t.n_bytes:
            raise BadFileError(f"file ends inside tensor {name!r}", self.path)
        return np.asarray(quants.dequantize(raw, t.type), dtype=np.float32).reshape(tuple(reversed(t.shape)))

    def token_bytes(self) -> list[bytes] | None:
        """The vocabulary as raw bytes (comparing bytes needs no decoding), or None without one."""
        if gguf.Keys.Tokenizer.LIST not in self.scan.values:
            return None
        f = self.reader.fields[gguf.Keys.Tokenizer.LIST]
        return [bytes(f.parts[i]) for i in f.data]

    def n_vocab(self) -> int | None:
        emb = self.tensors.get(TOKEN_EMBD)
        if emb is not None and len(emb.shape) >= 2:
            return emb.shape[1]
        toks = self.scan.values.get(gguf.Keys.Tokenizer.LIST)
        return toks.count if isinstance(toks, ArrayValue) else None


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Validate a GGUF file against its size. Raises BadFileError with one line naming the file and the fault."""
    path = Path(path)
    if not path.exists():
        raise BadFileError("no such file", path)
    if not path.is_file():
        raise BadFileError("not a regular file", path)
    try:
        scan = prescan(path)
    except OSError as e:
        raise BadFileError(f"cannot read: {e.strerror or e}", path) from None
    if scan.byteorder != "<":  # its tensor bytes would be copied or loaded as if little-endian
        raise BadFileError(
            "is a big-endian GGUF, which mtp-cli and llama.cpp on this machine do not read; "
            "convert it first (gguf-py's gguf_convert_endian.py FILE little)",
            path,
        )
    gf = GGUFFile(path, path.stat().st_size, scan)
    if not isinstance(gf.arch, str):
        raise BadFileError(f"general.architecture must be a string, not {gf.arch!r}", path)
    if gf.arch == "" and len(scan.tensors):
        raise BadFileError("not a valid GGUF model: general.architecture is missing", path)
    return gf
