"""What the installed llama.cpp build is: the compiler that built its CPU backend, whether the AMX
path is in it, and a fingerprint that changes whenever the libraries do (the self-check's key)."""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Optional

import llama_cpp

from mtp_cli.llama_ext.buffers import AMX, offered
from mtp_cli.llama_ext.ggml import lib_dir, library


@dataclass(frozen=True)
class BuildInfo:
    compiler: str  # e.g. "GCC 12.2.0", "clang 19.1.7"; "unknown" where the library does not say
    amx: bool  # ggml's AMX path is compiled in (and the CPU runs it)
    lib_dir: Path
    fingerprint: str  # changes with llama-cpp-python's version and any library file beside libllama


def elf_comment(path: Path) -> str:
    """The ELF `.comment` section (compilers write their name and version there); "" if none."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF only
        return ""
    end = "<" if data[5] == 1 else ">"
    (shoff,) = struct.unpack_from(end + "Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, off, size = struct.unpack_from(end + "IIQQQQ", data, shoff + i * shentsize)
        return name, off, size

    try:
        _, str_off, _ = section(shstrndx)
        for i in range(shnum):
            name, off, size = section(i)
            if data[str_off + name : data.index(b"\0", str_off + name)] == b".comment":
                return data[off : off + size].replace(b"\0", b"\n").decode("utf-8", "replace")
    except (struct.error, ValueError):
        return ""
    return ""


def compiler_of(comment: str) -> str:
    """ "clang 19.1.7" / "GCC 12.2.0" from a .comment section's lines (a library carries several:
    the C runtime's objects name the system GCC even in a clang build, so clang wins)."""
    clang = re.search(r"clang version (\d+[\d.]*)", comment)
    if clang:
        return f"clang {clang.group(1)}"
    gcc = re.findall(r"GCC: \(.*?\) (\d+[\d.]*)", comment)
    return f"GCC {max(gcc, key=lambda v: [int(x) for x in v.split('.') if x.isdigit()])}" if gcc else "unknown"


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha256(llama_cpp.__version__.encode())
    for f in sorted(folder.glob("*")) if folder.is_dir() else []:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@cache
def build_info() -> BuildInfo:
    """The loaded libraries' facts (once a process: they do not change under it)."""
    cpu_lib: Optional[Path] = library("ggml-cpu") or library("ggml")
    compiler = compiler_of(elf_comment(cpu_lib)) if cpu_lib else "unknown"
    return BuildInfo(compiler, AMX in offered(), lib_dir(), _fingerprint(lib_dir()))


__all__ = ["BuildInfo", "build_info", "compiler_of", "elf_comment"]
