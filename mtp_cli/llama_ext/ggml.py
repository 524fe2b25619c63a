"""ggml's backend registry (devices, buffer types), which the bindings do not wrap: its functions are
read from the libggml that llama-cpp-python ships beside libllama (already loaded by then)."""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any, Optional

import llama_cpp

DEV_TYPE_CPU = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


def lib_dir() -> Path:
    """The folder of the llama.cpp libraries the bindings load ($LLAMA_CPP_LIB_PATH, theirs too)."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    return Path(override) if override else Path(llama_cpp.__file__).parent / "lib"


def library(name: str = "ggml") -> Optional[Path]:
    """The path of libggml (or libggml-cpu, ...) beside libllama, None if it is not there."""
    file = {"darwin": f"lib{name}.dylib", "win32": f"{name}.dll"}.get(sys.platform, f"lib{name}.so")
    path = lib_dir() / file
    return path if path.exists() else None


@cache
def ggml() -> Optional[ctypes.CDLL]:
    """libggml with the signatures mtp-cli calls (None where the library cannot be found)."""
    llama_cpp.llama_backend_init()
    path = library()
    if path is None:
        return None
    g = ctypes.CDLL(str(path))
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    signatures: tuple[tuple[Any, list[Any], Any], ...] = (
        (g.ggml_backend_dev_count, [], sz),
        (g.ggml_backend_dev_get, [sz], vp),
        (g.ggml_backend_dev_by_name, [cp], vp),
        (g.ggml_backend_dev_by_type, [ctypes.c_int], vp),
        (g.ggml_backend_dev_type, [vp], ctypes.c_int),
        (g.ggml_backend_dev_name, [vp], cp),
        (g.ggml_backend_dev_description, [vp], cp),
        (g.ggml_backend_dev_memory, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
        (g.ggml_backend_dev_buffer_type, [vp], vp),
        (g.ggml_backend_dev_backend_reg, [vp], vp),
        (g.ggml_backend_reg_get_proc_address, [vp, cp], vp),
        (g.ggml_backend_reg_by_name, [cp], vp),
        (g.ggml_backend_register, [vp], None),
        (g.ggml_backend_buft_name, [vp], cp),
    )
    for fn, args, res in signatures:
        fn.argtypes, fn.restype = args, res
    return g


def text(raw: Optional[bytes]) -> str:
    return (raw or b"").decode("utf-8", "replace")


__all__ = ["DEV_TYPE_CPU", "ggml", "lib_dir", "library", "text"]
