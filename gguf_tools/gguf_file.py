"""Open a GGUF file safely: prescan its header (gguf_tools.prescan), then serve its keys and tensors.

Nothing reads a file the prescan has not passed; gguf's reader only on request.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType, quants

from gguf_tools.errors import BadFileError
from gguf_tools.names import OUTPUT, TOKEN_EMBD, TRUNK_MARKER, BlockLayout, block_index, key
from gguf_tools.prescan import ArrayValue, Prescan, TensorEntry, prescan

__all__ = ["GGUFFile", "open_gguf"]


class GGUFFile:
    """A validated GGUF: tensors by name (file order) and key-values from the prescan; gguf's reader
    only on request (it decodes every array item, which takes seconds on a large vocabulary)."""

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
        return v.contents() if isinstance(v, ArrayValue) else v

    def raw_values(self) -> dict[str, bytes]:
        """Each key's value exactly as encoded in the file (its type field onwards), read in one go:
        copied verbatim by a writer, a value needs no decoding and no re-encoding."""
        spans = self.scan.spans
        if not spans:
            return {}
        lo, hi = min(a for a, _ in spans.values()), max(b for _, b in spans.values())
        with open(self.path, "rb") as f:
            f.seek(lo)
            raw = f.read(hi - lo)
        if len(raw) != hi - lo:
            raise BadFileError("file shrank while its key-values were read", self.path)
        return {k: raw[a - lo : b - lo] for k, (a, b) in spans.items()}

    def arch_get(self, name: str, default: Any = None) -> Any:
        return self.get(key(self.arch, name), default)

    def fields(self) -> Iterator[gguf.ReaderField]:
        """Real key-values in file order, as gguf's reader decodes them (the reader's virtual GGUF.*
        fields left out). The library reads values with `get`; this is the independent view."""
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
        v = self.scan.values.get(gguf.Keys.Tokenizer.LIST)
        if not isinstance(v, ArrayValue) or v.etype != GGUFValueType.STRING:
            return None
        return list(v.items)

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
