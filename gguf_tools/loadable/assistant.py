"""Does this assistant drafter fit this target? A gemma4-assistant has no KV cache of its own: its
sliding-window layers attend over the target's second-to-last layer's cache and its global layers
over the target's last layer's (src/llama-model.cpp, the share callback of LLM_ARCH_GEMMA4_ASSISTANT),
reading them with its own head sizes. llama.cpp checks none of this: a head size that differs reads
the cache with the wrong stride (drafts that are noise, no error), a width that differs fails in the
graph. Asked before either file reaches llama.cpp, so that the refusal names the key."""

from __future__ import annotations

from gguf_tools.limits import ASSISTANT_READS_FROM_END
from gguf_tools.loadable.header import Header
from gguf_tools.names import ASSISTANT_FOR
from gguf_tools.prescan import Prescan


def _head_size(h: Header, swa: bool) -> int:
    return h.u32("attention.key_length_swa") if swa else h.head_dims()[0]


def assistant_problem(target: Prescan, assistant: Prescan) -> str | None:
    """Why `assistant` cannot draft for `target` (one line naming the keys), or None."""
    t, a = Header(target), Header(assistant)
    if ASSISTANT_FOR.get(t.arch) != a.arch:
        wants = [k for k, v in ASSISTANT_FOR.items() if v == a.arch]
        return f"a {a.arch} drafter drafts for {' or '.join(wants)} models, and the target is {t.arch or 'unknown'}"
    out = a.u32("embedding_length_out")
    if out != t.n_embd:
        return f"{a.key('embedding_length_out')} = {out}, and the target's {t.key('embedding_length')} = {t.n_embd}"
    pattern = t.ints("attention.sliding_window_pattern") or []
    n = len(pattern)
    ends = {swa: n - back for swa, back in ASSISTANT_READS_FROM_END.items()}
    if min(ends.values()) < 0 or any(bool(pattern[i]) != swa for swa, i in ends.items()):
        return (
            "the assistant reads the target's second-to-last block as sliding-window and its last as global, "
            f"and the target's {t.key('attention.sliding_window_pattern')} ends {[bool(x) for x in pattern[-2:]]}"
        )
    a_heads, t_kv = a.per_layer("attention.head_count"), t.per_layer("attention.head_count_kv")
    for il, swa in enumerate(bool(x) for x in (a.ints("attention.sliding_window_pattern") or [])):
        layer = ends[swa]
        which = "key_length_swa" if swa else "key_length"
        if _head_size(a, swa) != _head_size(t, swa):
            return (
                f"{a.key('attention.' + which)} = {_head_size(a, swa)}, and the target's "
                f"{t.key('attention.' + which)} = {_head_size(t, swa)} (its block {il} reads block {layer}'s cache)"
            )
        kv = t_kv[layer] if layer < len(t_kv) else 0
        heads = a_heads[il] if il < len(a_heads) else 0
        if kv <= 0 or heads % kv:
            return (
                f"{a.key('attention.head_count')} = {heads} at block {il} is not a multiple of the target's "
                f"{t.key('attention.head_count_kv')} = {kv} at block {layer}, whose cache it reads"
            )
    return None


__all__ = ["assistant_problem"]
