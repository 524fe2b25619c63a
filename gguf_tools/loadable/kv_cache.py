"""Would llama.cpp create a context with this KV cache type for this file? (src/llama-context.cpp
llama_init_from_model: a quantized K or V cache under flash attention needs every head size to be a
multiple of the type's block, and MLA models need the same type for K and V; a quantized V cache
without flash attention is refused too, which GenConfig.validated checks.) Asked before the context
is made, so that the refusal names the setting instead of "failed to create the context"."""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_tools.loadable.header import Header
from gguf_tools.prescan import Prescan


def block_size(cache_type: str) -> int:
    """Elements per block of a cache type named as llama.cpp's -ctk names it (f16: 1, q8_0: 32)."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[cache_type.upper()]][0]


def _head_sizes(h: Header, which: str) -> set[int]:
    dk, dv, _ = h.head_dims()
    sizes = {dk if which == "key" else dv}
    swa = h.u32(f"attention.{which}_length_swa")  # (gemma4's sliding-window layers)
    return sizes | ({swa} if swa else set())


def kv_cache_problem(scan: Prescan, type_k: str, type_v: str, flash_attn: bool | None) -> str | None:
    """Why llama.cpp would refuse these cache types for this file (`cache_type_k` / `cache_type_v`
    named), or None. `flash_attn` None is llama.cpp's auto (on with a quantized V cache)."""
    h = Header(scan)
    if (h.u32("attention.key_length_mla") or h.arch == "deepseek4") and type_k != type_v:
        return f"{h.arch} (MLA) needs one cache type for K and V: `cache_type_k` {type_k}, `cache_type_v` {type_v}"
    if flash_attn is False:
        return None  # (only a quantized V cache matters then: refused by GenConfig.validated)
    for name, ctype, which in (("cache_type_k", type_k, "key"), ("cache_type_v", type_v, "value")):
        blk = block_size(ctype)
        bad = sorted(d for d in _head_sizes(h, which) if d % blk)
        if bad:
            return (
                f"`{name}` {ctype} stores blocks of {blk}, and this model's {which} heads are {bad[0]} wide "
                f"(llama.cpp refuses the context with flash attention; use f16, or turn flash attention off "
                f"for a quantized K)"
            )
    return None


__all__ = ["kv_cache_problem", "block_size"]
