"""numpy views of llama.cpp's output buffers, made without ctypes pointer casts.

`np.ctypeslib.as_array(ptr, shape)` builds an array type and casts the pointer on every call (about
10 of a verify step's 100 us on a tiny model). Here the getters return plain addresses (their own
function objects with restype c_void_p: the bindings' shared ones are left as they are) and the views
are kept per (address, length): a buffer that stays put is viewed once.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


def address_getter(binding: Any, *argtypes: Any) -> Any:
    """The bindings' function `binding` (a context first, then `argtypes`) as a new function object
    at the same entry point, returning its pointer as an int (the bindings' own stays as it is)."""
    entry = ctypes.cast(binding, ctypes.c_void_p).value
    assert entry, binding
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, *argtypes)(entry)


_views: dict[tuple[int, int], np.ndarray] = {}
_MAX_VIEWS = 256  # (distinct buffers x lengths; cleared when full)


def float_view(address: int, n: int) -> np.ndarray:
    """A float32 view of `n` floats at `address` (cached: no copy, no ctypes cast)."""
    key = (address, n)
    v = _views.get(key)
    if v is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        buf: Any = (ctypes.c_float * n).from_address(address)
        v = _views[key] = np.frombuffer(buf, dtype=np.float32)
    return v


__all__ = ["address_getter", "float_view"]
