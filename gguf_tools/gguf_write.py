"""Write a GGUF from a plan: key-values, then tensors streamed from source files or given as arrays.

The header is encoded here as gguf.GGUFWriter encodes it, except that a key-value copied from a
source file keeps the source's bytes (a vocabulary is neither decoded nor re-encoded). Tensor bytes
are copied from their source file (copy_file_range where the OS has it), a trunk's whole data section
as one range where it keeps its layout, so memory does not grow with file size and a copied tensor is
bit-identical to its source. Output goes through gguf_tools.atomic: written out of sight, published
only when complete and checked.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from gguf_tools.atomic import atomic_output
from gguf_tools.errors import BadFileError, RefusedError, WriteError
from gguf_tools.prescan import GGUF_MAGIC, SCALAR_FORMATS, ArrayValue, Prescan, prescan_header

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
CHUNK = 256 << 20
ROW_WINDOW = 4 << 20  # bytes of output rows gathered at a time by a RowOrderTensor
_CFR_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EBADF, errno.EPERM}


@dataclass(frozen=True)
class KV:
    key: str
    value: Any
    type: GGUFValueType
    sub_type: GGUFValueType | None = None
    raw: bytes | None = field(default=None, compare=False, repr=False)  # the value as a source file encodes it


@dataclass(frozen=True)
class FileTensor:
    """A tensor whose bytes are copied verbatim from `path` at absolute `offset`."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order
    n_bytes: int
    path: Path
    offset: int


@dataclass(frozen=True)
class ArrayTensor:
    """A tensor given as an array: float arrays in numpy order, or uint8 rows for quantized types."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order
    data: np.ndarray

    @property
    def n_bytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class RowOrderTensor:
    """A tensor copied from `path` at absolute `offset` with its rows reordered: output row r is source row
    `order[r]`. A row is `row_bytes` long (one ne0 run: whole quantized blocks, or one element of a 1-D
    tensor), so rows move whole and nothing is decoded. Copied through a bounded window, never whole."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order
    n_bytes: int
    path: Path
    offset: int
    row_bytes: int
    order: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.row_bytes <= 0 or len(self.order) * self.row_bytes != self.n_bytes:
            raise ValueError(f"{self.name}: {len(self.order)} rows of {self.row_bytes} bytes != {self.n_bytes} bytes")
        if sorted(self.order) != list(range(len(self.order))):
            raise ValueError(f"{self.name}: row order is not a permutation")


Tensor = FileTensor | ArrayTensor | RowOrderTensor


@dataclass(frozen=True)
class WritePlan:
    arch: str
    alignment: int
    kvs: Sequence[KV]
    tensors: Sequence[Tensor]

    @property
    def n_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


def check_output(out: Path, inputs: Sequence[Path], overwrite: bool) -> None:
    """Refuse to clobber an existing file or an input unless asked; fail early on a missing folder."""
    if not out.parent.is_dir():
        raise RefusedError("output folder does not exist", out.parent)
    if out.exists() and out.is_dir():
        raise RefusedError("output is a folder", out)
    if out.exists() and not overwrite:
        raise RefusedError("output exists (`overwrite` replaces it)", out)
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise WriteError("cannot write into this folder (read-only or no permission)", out.parent)
    for p in inputs:
        if out.exists() and p.exists() and os.path.samefile(out, p) and not overwrite:
            raise RefusedError("output is one of the inputs (`overwrite` replaces it)", out)


def write_gguf(
    plan: WritePlan,
    out: Path,
    progress: Progress | None = None,
    *,
    overwrite: bool = True,
    verify: Callable[[Prescan], None] | None = None,
) -> None:
    """Write `plan` to `out` atomically (gguf_tools.atomic): out of sight, checked, then published;
    an existing `out` has its replacement fsynced first (a new file skips that: it costs seconds
    per GB). Without `overwrite` an existing `out` is refused, even one created meanwhile.
    The header is prescanned (and shown to `verify`) while the tensor data is copied, then read
    back from the file with its size: a bug here must not hand a bad file to llama.cpp."""
    offsets = _offsets(plan)
    header = encode_header(plan, offsets)
    data_start = _pad(len(header), plan.alignment)
    size = data_start + (offsets[-1] + _pad(plan.tensors[-1].n_bytes, plan.alignment) if offsets else 0)
    with atomic_output(out, overwrite=overwrite) as tmp, ThreadPoolExecutor(1) as pool:
        check = pool.submit(_check_header, header, size, out, verify)
        failed = lambda: check.done() and check.exception() is not None  # noqa: E731
        _write(plan, tmp, header + bytes(data_start - len(header)), offsets, size, progress, failed)
        check.result()  # a refusal stops the copy at its next chunk, and is raised here
        _check_written(tmp, header, size, out)


def _check_header(header: bytes, size: int, out: Path, verify: Callable[[Prescan], None] | None) -> None:
    try:
        scan = prescan_header(header, size, out)
        if verify is not None:
            verify(scan)
    except BadFileError as e:
        raise BadFileError(f"not written, it would be invalid ({e.message})", out) from None


def _check_written(tmp: Path, header: bytes, size: int, out: Path) -> None:
    with open(tmp, "rb") as f:
        if os.fstat(f.fileno()).st_size != size or f.read(len(header)) != header:
            raise BadFileError("not written: what reached the disk differs from what was written (a bug)", out)


def _write(
    plan: WritePlan,
    tmp: Path,
    header: bytes,
    offsets: list[int],
    size: int,
    progress: Progress | None,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    total, done = plan.n_bytes, 0
    sources: dict[Path, BinaryIO] = {}
    with open(tmp, "r+b") as fout:  # (not "wb": ext4 flushes a file truncated on open when it is closed)
        try:
            fout.write(header)
            for first, last, run in _runs(plan.tensors, offsets):
                fout.seek(len(header) + offsets[first])
                for n in _copy_run(plan.tensors[first : last + 1], run, fout, sources):
                    done += n
                    if progress:
                        progress(min(done, total), total)
                    if stop():
                        return
            fout.truncate(size)  # the last tensor's padding
        finally:
            for f in sources.values():
                f.close()


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _offsets(plan: WritePlan) -> list[int]:
    """Each tensor's offset in the data section: one after another, each padded to the alignment."""
    out, pos = [], 0
    for t in plan.tensors:
        out.append(pos)
        pos += _pad(t.n_bytes, plan.alignment)
    return out


def _runs(tensors: Sequence[Tensor], offsets: list[int]) -> Iterator[tuple[int, int, bool]]:
    """(first, last, is_range): consecutive FileTensors of one source laid out there exactly as they
    will be here (a trunk's whole data section, usually) make one range copied in one piece."""
    i = 0
    while i < len(tensors):
        j = i
        while j + 1 < len(tensors) and _continues(tensors[j], tensors[j + 1], offsets[j + 1] - offsets[j]):
            j += 1
        yield i, j, j > i
        i = j + 1


def _continues(a: Tensor, b: Tensor, step: int) -> bool:
    return isinstance(a, FileTensor) and type(b) is FileTensor and a.path == b.path and b.offset - a.offset == step


def _source(path: Path, sources: dict[Path, BinaryIO]) -> BinaryIO:
    """`path` opened once for reading, read ahead as a stream (cp does the same: it halves a GB copy here)."""
    src = sources.get(path)
    if src is None:
        try:
            src = sources[path] = open(path, "rb")
        except OSError as e:
            raise BadFileError(f"cannot read: {e.strerror or e}", path) from None
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(src.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return src


def _copy_run(run: Sequence[Tensor], is_range: bool, fout: BinaryIO, sources: dict[Path, BinaryIO]) -> Iterator[int]:
    if not is_range:
        yield from _copy_tensor(run[0], fout, sources)
        return
    first, last = run[0], run[-1]
    assert isinstance(first, FileTensor) and isinstance(last, FileTensor)
    src = _source(first.path, sources)
    yield from _copy_range(src, first.offset, last.offset + last.n_bytes - first.offset, fout, first.path)


# ---- the header: GGUF v3, little-endian, as gguf.GGUFWriter writes it -------------------------

_PACK = {t: "<" + code for t, code in SCALAR_FORMATS.items()}  # (GGUF v3 is little-endian)


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: GGUFValueType, value: Any, sub_type: GGUFValueType | None = None) -> bytes:
    """A key's value as GGUF encodes it, type field first."""
    head = struct.pack("<I", int(vtype))
    if vtype == GGUFValueType.STRING:
        return head + _string(value)
    if vtype != GGUFValueType.ARRAY:
        return head + struct.pack(_PACK[vtype], value)
    if sub_type is None or sub_type == GGUFValueType.ARRAY:
        raise ValueError("arrays need a scalar or string element type")
    if isinstance(value, ArrayValue):
        value = value.contents()
    head += struct.pack("<IQ", int(sub_type), len(value))
    if sub_type == GGUFValueType.STRING:
        return head + b"".join(_string(v) for v in value)
    return head + np.asarray(value, dtype=np.dtype(_PACK[sub_type])).tobytes()


def encode_header(plan: WritePlan, offsets: Sequence[int]) -> bytes:
    """Magic, counts, key-values (general.architecture first; a KV carrying its source's bytes is
    copied verbatim) and tensor infos, unpadded."""
    kvs = [kv for kv in plan.kvs if kv.key != "general.architecture"]
    parts = [GGUF_MAGIC, struct.pack("<IQQ", 3, len(plan.tensors), len(kvs) + 1)]
    parts += [_string("general.architecture"), encode_value(GGUFValueType.STRING, plan.arch)]
    for kv in kvs:
        parts += [_string(kv.key), kv.raw if kv.raw is not None else encode_value(kv.type, kv.value, kv.sub_type)]
    for t, off in zip(plan.tensors, offsets):
        parts += [_string(t.name), struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *t.shape, int(t.type), off)]
    return b"".join(parts)


def _copy_tensor(t: Tensor, fout: BinaryIO, sources: dict[Path, BinaryIO]) -> Iterator[int]:
    if isinstance(t, ArrayTensor):
        fout.write(np.ascontiguousarray(t.data).tobytes())
        yield t.n_bytes
        return
    src = _source(t.path, sources)
    if isinstance(t, RowOrderTensor):
        yield from _copy_rows(src, t, fout)
    else:
        yield from _copy_range(src, t.offset, t.n_bytes, fout, t.path)


def _read(src: BinaryIO, n: int, pos: int, path: Path) -> bytes:
    """Up to n bytes of src at pos; a read error names the source (not the output)."""
    try:
        if hasattr(os, "pread"):
            return os.pread(src.fileno(), n, pos)
        src.seek(pos)  # Windows
        return src.read(n)
    except OSError as e:
        raise BadFileError(f"cannot read: {e.strerror or e}", path) from None


def _pread(src: BinaryIO, n: int, pos: int, path: Path) -> bytes:
    parts, left = [], n
    while left:
        got = _read(src, left, pos, path)
        if not got:
            raise BadFileError(f"file shrank while being read (wanted {left} more bytes at {pos})", path)
        parts.append(got)
        left -= len(got)
        pos += len(got)
    return b"".join(parts)


def _copy_rows(src: BinaryIO, t: RowOrderTensor, fout: BinaryIO) -> Iterator[int]:
    """Write t's rows in t.order, a window of output rows at a time.

    A window whose source rows lie close together (a per-head shuffle) is read with one pread and
    gathered in memory; otherwise each contiguous run of source rows is read on its own. Memory is
    bounded by a few windows whatever the tensor or file size.
    """
    rb = t.row_bytes
    order = np.asarray(t.order, dtype=np.int64)
    per = max(1, ROW_WINDOW // rb)
    for a in range(0, len(order), per):
        idx = order[a : a + per]
        lo, hi = int(idx.min()), int(idx.max()) + 1
        if hi - lo <= 2 * len(idx):
            span = np.frombuffer(_pread(src, (hi - lo) * rb, t.offset + lo * rb, t.path), np.uint8)
            fout.write(span.reshape(hi - lo, rb)[idx - lo].tobytes())
        else:
            breaks = np.flatnonzero(np.diff(idx) != 1) + 1
            for run in np.split(idx, breaks):
                fout.write(_pread(src, len(run) * rb, t.offset + int(run[0]) * rb, t.path))
        yield len(idx) * rb


def _copy_range(src: BinaryIO, offset: int, n_bytes: int, fout: BinaryIO, path: Path) -> Iterator[int]:
    """Copy n_bytes from src at offset to fout's current position, chunk by chunk."""
    fout.flush()
    left, pos = n_bytes, offset
    use_cfr = hasattr(os, "copy_file_range")
    while left:
        n = min(CHUNK, left)
        if use_cfr:
            try:
                got = os.copy_file_range(src.fileno(), fout.fileno(), n, pos)
            except OSError as e:
                if e.errno not in _CFR_UNSUPPORTED:
                    raise  # ENOSPC, EIO...: a real fault, not a missing feature
                use_cfr = False  # e.g. across file systems on old kernels: fall back to read/write
                fout.seek(0, os.SEEK_END)
                continue
        else:
            buf = _read(src, n, pos, path)
            got = len(buf)
            fout.write(buf)
        if got == 0:
            raise BadFileError(f"file shrank while being read (wanted {left} more bytes at {pos})", path)
        left -= got
        pos += got
        yield got
    if use_cfr:
        fout.seek(0, os.SEEK_END)  # copy_file_range moved the fd offset; keep Python's view in step
