"""Write a GGUF from a plan: key-values, then tensors streamed from source files or given as arrays.

The header goes through `gguf.GGUFWriter`; tensor bytes are copied range by range from their source
file (copy_file_range where the OS has it), so memory does not grow with file size and a copied
tensor is bit-identical to its source. Output goes through gguf_tools.atomic: a temporary file
beside the target, renamed into place only when complete.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from gguf_tools.atomic import atomic_output
from gguf_tools.errors import BadFileError, RefusedError, WriteError
from gguf_tools.gguf_file import Prescan, prescan

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
CHUNK = 16 << 20
ROW_WINDOW = 4 << 20  # bytes of output rows gathered at a time by a RowOrderTensor
_CFR_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EBADF, errno.EPERM}


@dataclass(frozen=True)
class KV:
    key: str
    value: Any
    type: GGUFValueType
    sub_type: GGUFValueType | None = None


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
    `verify` sees the written header before it is published."""
    with atomic_output(out, overwrite=overwrite) as tmp:
        _write(plan, tmp, progress)
        try:  # re-check what we wrote: a bug here must not hand a bad file to llama.cpp
            scan = prescan(tmp)
            if verify is not None:
                verify(scan)
        except BadFileError as e:
            raise BadFileError(f"not written, it would be invalid ({e.message})", out) from None


def _write(plan: WritePlan, tmp: Path, progress: Progress | None) -> None:
    writer = GGUFWriter(path=None, arch=plan.arch)
    writer.data_alignment = plan.alignment
    for kv in plan.kvs:
        if kv.key == "general.architecture":
            continue  # GGUFWriter writes it first from `arch`
        writer.add_key_value(kv.key, kv.value, kv.type, sub_type=kv.sub_type)
    for t in plan.tensors:
        # uint8 + raw_dtype: the shape is given in bytes and converted by the writer; give ggml order via numpy order
        writer.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.n_bytes, raw_dtype=t.type)
    writer.write_header_to_file(path=tmp)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None
    fout = writer.fout[0]
    total, done = plan.n_bytes, 0
    sources: dict[Path, BinaryIO] = {}
    try:
        for t in plan.tensors:
            writer.write_padding(fout, fout.tell())
            for n in _copy_tensor(t, fout, sources):
                done += n
                if progress:
                    progress(done, total)
            writer.write_padding(fout, t.n_bytes)
        fout.flush()
    finally:
        writer.close()
        for f in sources.values():
            f.close()


def _copy_tensor(t: Tensor, fout: BinaryIO, sources: dict[Path, BinaryIO]) -> Iterator[int]:
    if isinstance(t, ArrayTensor):
        fout.write(np.ascontiguousarray(t.data).tobytes())
        yield t.n_bytes
        return
    src = sources.get(t.path)
    if src is None:
        src = sources[t.path] = open(t.path, "rb")
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
