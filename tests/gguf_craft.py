"""Hand-assembled GGUF bytes for hostile-input tests: every count, length and offset can lie."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

STRING, ARRAY, UINT32, UINT64 = 8, 9, 4, 10
F32, Q8_0 = 0, 8


def s(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def kv_str(k: str | bytes, v: str | bytes) -> bytes:
    return s(k) + struct.pack("<I", STRING) + s(v)


def kv_u32(k: str, v: int) -> bytes:
    return s(k) + struct.pack("<II", UINT32, v)


@dataclass
class Crafted:
    """A small valid GGUF (arch 'llama', two F32 tensors) whose parts a test may replace."""

    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None
    n_kv: int | None = None
    kvs: list[bytes] = field(
        default_factory=lambda: [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 1)]
    )
    # (name, dims, type, offset)
    tensors: list[tuple[bytes | str, list[int], int, int]] = field(
        default_factory=lambda: [("a.weight", [8], F32, 0), ("b.weight", [8, 2], F32, 32)]
    )
    data_bytes: int = 32 + 64
    alignment: int = 32
    cut: int | None = None  # truncate the result to this many bytes

    def build(self) -> bytes:
        head = self.magic + struct.pack("<I", self.version)
        head += struct.pack(
            "<QQ",
            len(self.tensors) if self.n_tensors is None else self.n_tensors,
            len(self.kvs) if self.n_kv is None else self.n_kv,
        )
        head += b"".join(self.kvs)
        for name, dims, ttype, offset in self.tensors:
            head += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            head += struct.pack("<IQ", ttype, offset)
        head += b"\0" * (-len(head) % self.alignment)
        out = head + bytes(range(256)) * (self.data_bytes // 256) + bytes(self.data_bytes % 256)
        return out if self.cut is None else out[: self.cut]
