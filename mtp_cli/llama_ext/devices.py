"""The backend devices llama.cpp sees (ggml's device registry: CPU, CUDA0, Metal...), for --version,
the GPU check and -dev / -ot."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.ggml import DEV_TYPE_CPU, ggml, text


@dataclass(frozen=True)
class Device:
    name: str  # e.g. "CUDA0"
    description: str  # e.g. "NVIDIA H200"
    memory_total: int  # bytes (0 where the backend does not say)
    memory_free: int


def devices() -> list[Device]:
    """Every device ggml registered (empty if its library cannot be found)."""
    g = ggml()
    if g is None:
        return []
    out = []
    for i in range(g.ggml_backend_dev_count()):
        d = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        name, desc = text(g.ggml_backend_dev_name(d)), text(g.ggml_backend_dev_description(d))
        out.append(Device(name, desc, int(total.value), int(free.value)))
    return out


DEV_TYPES_OFFLOAD = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU (an RPC server's devices say GPU)


def has_offload_device() -> bool:
    """Whether ggml has registered a device layers can be offloaded to."""
    g = ggml()
    if g is None:
        return False
    return any(
        g.ggml_backend_dev_type(g.ggml_backend_dev_get(i)) in DEV_TYPES_OFFLOAD
        for i in range(g.ggml_backend_dev_count())
    )


def device_list(names: Sequence[str]) -> ctypes.Array[ctypes.c_void_p]:
    """llama.cpp's -dev: the NULL-terminated device array for model params (("none",): no device,
    all on the CPU). As llama.cpp does, the CPU is not a device to list. Raises LlamaError naming
    an unknown one and the ones there are."""
    g = ggml()
    if g is None:
        raise LlamaError("ggml's library was not found: -dev cannot be used")
    if tuple(names) == ("none",):
        return (ctypes.c_void_p * 1)()
    found = []
    for name in names:
        dev = g.ggml_backend_dev_by_name(name.encode())
        if not dev or g.ggml_backend_dev_type(dev) == DEV_TYPE_CPU:
            offload = [d.name for d in devices() if d.name != "CPU"]
            there = ", ".join(offload) or "none"
            raise LlamaError(f"device {name!r} is not one llama.cpp can offload to (there are: {there})")
        found.append(dev)
    return (ctypes.c_void_p * (len(found) + 1))(*found, None)


def buffer_types() -> dict[str, int]:
    """Each device's own buffer type by name ("CPU", "CUDA0", ...), what -ot may name."""
    g = ggml()
    if g is None:
        return {}
    out: dict[str, int] = {}
    for i in range(g.ggml_backend_dev_count()):
        buft = g.ggml_backend_dev_buffer_type(g.ggml_backend_dev_get(i))
        if buft:
            out[text(g.ggml_backend_buft_name(buft))] = int(buft)
    return out


class _Override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def override_list(overrides: Sequence[tuple[str, str]]) -> ctypes.Array[_Override]:
    """llama.cpp's -ot: the NULL-terminated (pattern, buffer type) array for model params. Raises
    LlamaError naming an unknown buffer type and the ones there are."""
    known = buffer_types()
    rows = []
    for pattern, name in overrides:
        if name not in known:
            there = ", ".join(known)
            raise LlamaError(f"buffer type {name!r} (in {pattern}={name}) is unknown here (there are: {there})")
        rows.append(_Override(pattern.encode(), known[name]))
    return (_Override * (len(rows) + 1))(*rows, _Override(None, None))


__all__ = ["Device", "buffer_types", "device_list", "devices", "override_list"]
