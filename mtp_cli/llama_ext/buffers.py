"""The CPU backend's extra buffer types (AMX, CPU_REPACK): which this build offers, and which
llama.cpp may place weights in.

llama.cpp's loader walks the NULL-terminated list `ggml_backend_dev_get_extra_bufts` returns and
puts each weight in the first buffer type that takes it. Model params offer all or none
(`use_extra_bufts`), and a tensor override to "CPU" walks the same list again, so neither can keep
repack while leaving AMX out. The list is ggml's own static array, read at every model load: we
rewrite it in place (the kept types, in their order, then NULLs) and can restore it. Process-wide,
as it must be: a model loaded later must not bring AMX back.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Optional

from mtp_cli.llama_ext.ggml import DEV_TYPE_CPU, ggml, text

AMX = "AMX"
REPACK = "CPU_REPACK"

_original: list[int] = []  # the array's entries as ggml made them (filled on first use)


def _array() -> tuple[Optional[ctypes.CDLL], Optional[ctypes.Array[ctypes.c_void_p]]]:
    """ggml's NULL-terminated extra buffer type array (None where the build has no such list)."""
    g = ggml()
    if g is None:
        return None, None
    dev = g.ggml_backend_dev_by_type(DEV_TYPE_CPU)
    reg = g.ggml_backend_dev_backend_reg(dev)
    fn_addr = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not dev or not fn_addr:
        return g, None
    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(fn_addr)
    base = fn(dev)
    if not base:
        return g, None
    if not _original:
        entries = ctypes.cast(base, ctypes.POINTER(ctypes.c_void_p))
        i = 0
        while entries[i]:
            _original.append(int(entries[i]))
            i += 1
    return g, (ctypes.c_void_p * (len(_original) + 1)).from_address(base)


def offered() -> tuple[str, ...]:
    """Every extra buffer type this build's CPU backend offers, in llama.cpp's order."""
    g, arr = _array()
    if g is None or arr is None:
        return ()
    return tuple(text(g.ggml_backend_buft_name(p)) for p in _original)


def in_use() -> tuple[str, ...]:
    """The extra buffer types a model loaded now may be placed in."""
    g, arr = _array()
    if g is None or arr is None:
        return ()
    return tuple(text(g.ggml_backend_buft_name(p)) for p in arr if p)


def keep(names: Optional[Collection[str]]) -> tuple[str, ...]:
    """Let weights go only to the extra buffer types named (None: all this build offers, as
    llama.cpp would); affects models loaded from now on. Returns the ones now in use."""
    g, arr = _array()
    if g is None or arr is None:
        return ()
    kept = [p for p in _original if names is None or text(g.ggml_backend_buft_name(p)) in names]
    for i in range(len(arr)):
        arr[i] = kept[i] if i < len(kept) else None
    return in_use()


@contextmanager
def without(name: str) -> Iterator[None]:
    """Leave one extra buffer type out for the loads inside (weights are placed at load time)."""
    before = in_use()
    if name not in before:
        yield
        return
    keep([b for b in before if b != name])
    try:
        yield
    finally:
        keep(before)


__all__ = ["AMX", "REPACK", "in_use", "keep", "offered", "without"]
