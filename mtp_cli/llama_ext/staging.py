"""The staging MTP API: `llama_cpp.llama_cpp_ext` (nextn embeddings, nextn layer offset, ctx_other).

These bindings are not a stable API of llama-cpp-python; this is the only module that imports them.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
from llama_cpp import llama_cpp_ext as _X

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.handles import Context
from mtp_cli.llama_ext.models import n_embd_out
from mtp_cli.llama_ext.views import address_getter, float_view

# (the staging API's getters, returning addresses: views.py says why)
nextn_address = address_getter(_X.llama_get_embeddings_nextn)
nextn_ith_address = address_getter(_X.llama_get_embeddings_nextn_ith, ctypes.c_int32)


def set_embeddings_nextn(ctx: Context, enabled: bool, masked: bool) -> None:
    """Target: (True, False) -> one h row per batch token. MTP draft: (True, True) -> h rows for
    output rows only (read them with get_embeddings_nextn_ith)."""
    _X.llama_set_embeddings_nextn(ctx, bool(enabled), bool(masked))


def get_embeddings_nextn(ctx: Context, n_rows: int, *, copy: bool = True, n_embd: Optional[int] = None) -> np.ndarray:
    """The first `n_rows` h rows of the last decode, shape (n_rows, n_embd_out), float32.
    copy=False returns a view into llama.cpp's buffer, valid until the next decode. Pass n_embd
    (= n_embd_out of the model) to skip looking it up."""
    address = nextn_address(ctx)
    if not address:
        raise LlamaError("no nextn embeddings (set_embeddings_nextn not enabled, or nothing decoded)")
    n = n_embd if n_embd else n_embd_out(ctx.model)
    arr = float_view(address, int(n_rows) * n).reshape(int(n_rows), n)
    return arr.copy() if copy else arr


def get_embeddings_nextn_ith(ctx: Context, i: int, *, copy: bool = True, n_embd: Optional[int] = None) -> np.ndarray:
    """The h row of batch index `i` (negative: from the end of the outputs), shape (n_embd_out,)."""
    address = nextn_ith_address(ctx, int(i))
    if not address:
        raise LlamaError(f"no nextn embedding row for batch index {i}")
    n = n_embd if n_embd else n_embd_out(ctx.model)
    arr = float_view(address, n)
    return arr.copy() if copy else arr


def set_nextn_layer_offset(ctx: Context, offset: int) -> None:
    """Select which appended head block the MTP graph runs (chained-head archs, e.g. step35)."""
    _X.llama_set_nextn_layer_offset(ctx, int(offset))


def reads_memory_of(ctx: Context, other: Context) -> bool:
    """Whether llama.cpp kept `other` as ctx's ctx_other (it does only where the arch reads the
    target's memory, e.g. gemma4-assistant)."""
    kept = ctypes.cast(_X.llama_get_ctx_other(ctx), ctypes.c_void_p).value
    return bool(kept) and kept == ctypes.cast(other._as_parameter_, ctypes.c_void_p).value
