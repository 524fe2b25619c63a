"""Does this assistant drafter fit this target? A gemma4-assistant has no KV cache of its own: its
sliding-window layers attend over the target's second-to-last layer's cache and its global layers
over the target's last layer's (src/llama-model.cpp, the share callback of LLM_ARCH_GEMMA4_ASSISTANT;
a target whose last layers reuse earlier layers' KV redirects there), and it views that cache with
its own head size and KV head count (src/llama-kv-cache.cpp get_k/get_v, whose size check is an
assert that release builds drop). llama.cpp checks none of this: a head size or KV head count that
differs reads the cache at the wrong stride (drafts that are noise, no error) or past its end (an
abort), and a width that differs fails in the graph. Asked before either file reaches llama.cpp, so
that the refusal names the key. (Rope settings and the window are the assistant's own too; a
mismatch there would only weaken its drafts, and is not checked.)"""

from __future__ import annotations

from gguf_tools.limits import ASSISTANT_READS_FROM_END
from gguf_tools.loadable.header import Header
from gguf_tools.names import ASSISTANT_FOR
from gguf_tools.prescan import Prescan


def _head_size(h: Header, swa: bool) -> int:
    return h.u32("attention.key_length_swa") if swa else h.head_dims()[0]


def _kv_heads(h: Header, il: int) -> int:
    kv = h.kv_heads()
    return kv[il] if il < len(kv) else 0


def _pattern(h: Header, n: int) -> list[bool]:
    """Sliding-window flag of each of n blocks (entries past the array: not sliding-window)."""
    arr = h.ints("attention.sliding_window_pattern") or []
    return [bool(arr[i]) if i < len(arr) else False for i in range(n)]


def _read_layer(t: Header, n: int, swa: bool) -> int:
    """The target block whose cache an assistant block of this kind reads, after the target's own
    KV sharing (llama-model.cpp reuse: blocks from n_layer_kv_from_start on use an earlier one's)."""
    layer = n - ASSISTANT_READS_FROM_END[swa]
    from_start = n - t.u32("attention.shared_kv_layers")
    return from_start - ASSISTANT_READS_FROM_END[swa] if layer >= from_start else layer


def assistant_problem(target: Prescan, assistant: Prescan) -> str | None:
    """Why `assistant` cannot draft for `target` (one line naming the keys), or None."""
    t, a = Header(target), Header(assistant)
    if ASSISTANT_FOR.get(t.arch) != a.arch:
        wants = [k for k, v in ASSISTANT_FOR.items() if v == a.arch]
        return f"a {a.arch} drafter drafts for {' or '.join(wants)} models, and the target is {t.arch or 'unknown'}"
    out = a.u32("embedding_length_out")
    if out != t.n_embd:
        return f"{a.key('embedding_length_out')} = {out}, and the target's {t.key('embedding_length')} = {t.n_embd}"
    n = t.n_layers - t.n_nextn
    t_swa = _pattern(t, n)
    for il, swa in enumerate(_pattern(a, a.n_layers)):
        back = ASSISTANT_READS_FROM_END[swa]
        if n < back or t_swa[n - back] != swa:
            kind = "sliding-window" if swa else "global"
            return (
                f"the assistant's {kind} blocks read the target's block {n - back} as {kind}, and the target's "
                f"{t.key('attention.sliding_window_pattern')} ends {t_swa[-2:]}"
            )
        layer = _read_layer(t, n, swa)
        which = "key_length_swa" if swa else "key_length"
        if _head_size(a, swa) != _head_size(t, swa):
            return (
                f"{a.key('attention.' + which)} = {_head_size(a, swa)}, and the target's "
                f"{t.key('attention.' + which)} = {_head_size(t, swa)} (its block {il} reads block {layer}'s cache)"
            )
        if _kv_heads(a, il) != _kv_heads(t, layer):
            return (
                f"{a.key('attention.head_count_kv')} = {_kv_heads(a, il)} at block {il}, and the target's "
                f"{t.key('attention.head_count_kv')} = {_kv_heads(t, layer)} at block {layer}, whose cache it reads"
            )
    return None


__all__ = ["assistant_problem"]
