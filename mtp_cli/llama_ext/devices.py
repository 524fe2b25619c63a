"""The backend devices llama.cpp sees (ggml's device registry: CPU, CUDA0, Metal...), for --version
and the GPU check. The bindings do not wrap ggml's registry; its functions are read from the ggml
library that llama-cpp-python ships beside libllama (already loaded by then)."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import llama_cpp


@dataclass(frozen=True)
class Device:
    name: str  # e.g. "CUDA0"
    description: str  # e.g. "NVIDIA H200"
    memory_total: int  # bytes (0 where the backend does not say)
    memory_free: int


def _ggml() -> Optional[ctypes.CDLL]:
    lib = Path(llama_cpp.__file__).parent / "lib"
    name = {"darwin": "libggml.dylib", "win32": "ggml.dll"}.get(sys.platform, "libggml.so")
    path = lib / name
    if not path.exists():
        return None
    g = ctypes.CDLL(str(path))
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_dev_get.argtypes, g.ggml_backend_dev_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    for f in (g.ggml_backend_dev_name, g.ggml_backend_dev_description):
        f.argtypes, f.restype = [ctypes.c_void_p], ctypes.c_char_p
    size_p = ctypes.POINTER(ctypes.c_size_t)
    g.ggml_backend_dev_memory.argtypes, g.ggml_backend_dev_memory.restype = [ctypes.c_void_p, size_p, size_p], None
    return g


def devices() -> list[Device]:
    """Every device ggml registered (empty if its library cannot be found)."""
    llama_cpp.llama_backend_init()
    g = _ggml()
    if g is None:
        return []
    out = []
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        name = (g.ggml_backend_dev_name(d) or b"").decode("utf-8", "replace")
        desc = (g.ggml_backend_dev_description(d) or b"").decode("utf-8", "replace")
        out.append(Device(name, desc, int(total.value), int(free.value)))
    return out


__all__ = ["Device", "devices"]
