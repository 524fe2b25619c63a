"""Read a GGUF header without trusting it: every count, length and offset capped by the bytes left.

`gguf.GGUFReader` and llama.cpp's loader both trust the counts, lengths and offsets a file declares;
a hostile or truncated file can make them loop for ever, allocate without bound or read past the end.
`prescan` walks the header with those numbers checked against the real file size, and keeps what it
read (key-values undecoded where they are big, each key's bytes, the tensor table).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from gguf_tools.errors import BadFileError

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_NESTING = 4  # arrays of arrays; real files use at most 1 level
# The one table of GGUF scalar value types: their struct codes (byte order apart), which numpy reads
# as dtypes too; the writer packs with them, the header checks tell integers from floats by them.
SCALAR_FORMATS = {
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
_U64 = {"<": struct.Struct("<Q"), ">": struct.Struct(">Q")}
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


@dataclass(frozen=True, eq=False)
class ArrayValue:
    """An array key-value as the prescan read it: its element type and items, undecoded (numbers as
    a numpy array, strings as bytes, nested arrays as ArrayValues), so a vocabulary is read once,
    quickly, and decoded only if asked for."""

    count: int
    etype: GGUFValueType
    items: np.ndarray | list[bytes] | list[ArrayValue]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Any]:
        return iter(self.contents())

    def __getitem__(self, i: Any) -> Any:
        return self.contents()[i]

    def contents(self) -> list[Any]:
        """The items as Python values, as gguf's reader gives them."""
        if isinstance(self.items, np.ndarray):
            return self.items.tolist()
        if self.etype == GGUFValueType.STRING:
            return [b.decode("utf-8", errors="surrogateescape") for b in self.items]  # type: ignore[union-attr]
        return [a.contents() for a in self.items]  # type: ignore[union-attr]


@dataclass(frozen=True)
class Prescan:
    """What the header declares, checked against the file size."""

    version: int
    byteorder: str  # "<" or ">"
    alignment: int
    data_start: int
    values: dict[str, Any]  # scalars and strings as read; arrays as ArrayValue
    tensors: tuple[TensorEntry, ...]
    types: dict[str, GGUFValueType]  # each key's value type
    spans: dict[str, tuple[int, int]]  # each key's encoded value (its type field to its end), in the file


class _Cursor:
    """Bounds-checked reads over a mapped file; every failure names what was being read."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path, file_size: int | None = None):
        self.buf, self.path, self.pos, self.bo = buf, path, 0, "<"
        self.size = len(buf)  # what can be read
        self.file_size = self.size if file_size is None else file_size  # where tensor data must end

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
            return self.unpack(SCALAR_FORMATS[vt], what)
        if depth >= MAX_NESTING:
            raise self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        etype = self.unpack("I", f"the element type of {what}")
        count = self.unpack("Q", f"the length of {what}")
        if etype not in _VALUE_TYPES:
            raise self.fail(f"{what} has unknown element type {etype}")
        et = GGUFValueType(etype)
        if et in SCALAR_FORMATS:
            raw = self.take(count * struct.calcsize(SCALAR_FORMATS[et]), f"{what} ({count} elements)")
            return ArrayValue(
                count,
                et,
                np.frombuffer(raw, dtype=np.dtype(SCALAR_FORMATS[et]).newbyteorder("<" if self.bo == "<" else ">")),
            )
        # Each string or array element takes at least 8 bytes: cap the count before looping over it.
        if count * 8 > self.remaining():
            raise self.fail(f"{what} declares {count} elements, more than the file can hold")
        if et == GGUFValueType.STRING:
            return ArrayValue(count, et, self.strings(count, what))
        return ArrayValue(count, et, [self.skip_value(etype, what, depth + 1) for _ in range(count)])

    def strings(self, count: int, what: str) -> list[bytes]:
        """`count` length-prefixed strings, undecoded (a vocabulary: the hot loop of a prescan).
        A declared length past the end only shortens a slice, so the bound is checked once, after."""
        buf, pos, unpack = self.buf, self.pos, _U64[self.bo].unpack_from
        out: list[bytes] = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                append(buf[pos : pos + n])
                pos += n
        except (struct.error, OverflowError):
            raise self.fail(f"file ends inside {what}") from None
        if pos > self.size:
            raise self.fail(f"{what} runs past the end of the file")
        self.pos = pos
        return out


def prescan(path: Path) -> Prescan:
    """Validate the structure of a GGUF file without trusting any count, length or offset in it."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise BadFileError(f"not a GGUF file: only {size} bytes", path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _prescan(_Cursor(buf, path))


def prescan_header(header: bytes, file_size: int, path: Path) -> Prescan:
    """`prescan` of a header held in memory, for a file of `file_size` bytes (a writer's own check)."""
    return _prescan(_Cursor(header, path, file_size))


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
    types: dict[str, GGUFValueType] = {}
    spans: dict[str, tuple[int, int]] = {}
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        name = cur.string(f"key #{i}")
        if name in values:
            raise cur.fail(f"key {name!r} appears twice")
        start = cur.pos
        vtype = cur.unpack("I", f"the type of key {name!r}")
        value = values[name] = cur.skip_value(vtype, f"key {name!r}")
        types[name], spans[name] = GGUFValueType(vtype), (start, cur.pos)
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
    return Prescan(version, cur.bo, alignment, data_start, values, tensors, types, spans)


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
        if n_bytes > cur.file_size:  # stop before the product grows without bound
            break
    if offset % alignment:
        raise cur.fail(f"tensor {name!r} offset {offset} is not aligned to {alignment}")
    end = data_start + offset + n_bytes
    if end > cur.file_size:
        raise BadFileError(
            f"truncated or corrupt GGUF: tensor {name!r} ends at byte {end}, "
            f"past the end of the file ({cur.file_size} bytes)",
            cur.path,
        )
    return TensorEntry(name, qtype, shape, n_bytes, data_start + offset)


def _check_overlaps(cur: _Cursor, tensors: tuple[TensorEntry, ...]) -> None:
    by_offset = sorted(tensors, key=lambda t: t.offset)
    for a, b in zip(by_offset, by_offset[1:]):
        if a.offset + a.n_bytes > b.offset:
            raise cur.fail(f"tensors {a.name!r} and {b.name!r} overlap")
