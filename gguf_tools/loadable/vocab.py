"""The vocabulary as llama.cpp loads and uses it (src/llama-vocab.cpp); gguf_tools.limits cites each rule."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from gguf import GGUFValueType as T

from gguf_tools.limits import BPE_MODELS, NO_TOKENIZER_MODELS, TOKEN_TYPE_BYTE, TOKENIZER_MODELS
from gguf_tools.loadable.header import Header, Problem, check, problem
from gguf_tools.prescan import ArrayValue

# what each tokenizer adds with add_special (our runtime always asks) and its default ids
# (src/llama-vocab.cpp: SPM 1942-1990, BPE 2000-2030, WPM 2031-2040, UGM 2041-2075)
_ADDS = {"llama": ("bos",), "bert": ("bos", "seperator"), "t5": ("eos",)}
_DEFAULT_ID = {
    "llama": {"bos": 1, "eos": 2},
    "bert": {"bos": 101, "seperator": 102},
    "t5": {"eos": 1},
    "gpt2": {"bos": 11, "eos": 11},
}


@check
def tokenizer(h: Header) -> Iterator[Problem]:
    model = h.values.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        yield problem("tokenizer-model", "tokenizer.ggml.model", "tokenizer.ggml.model is missing")
        return
    if model not in TOKENIZER_MODELS:
        yield problem(
            "tokenizer-model",
            "tokenizer.ggml.model",
            f"tokenizer.ggml.model = {model!r} is not a tokenizer llama.cpp knows",
        )
        return
    if model in NO_TOKENIZER_MODELS:
        yield problem(
            "no-tokenizer", "tokenizer.ggml.model", f"tokenizer.ggml.model = {model!r}: no text can be tokenized"
        )
        return
    toks = h.tokens()
    if toks is None:
        yield problem("token-list", "tokenizer.ggml.tokens", "tokenizer.ggml.tokens is missing or not strings")
        return
    yield from _arrays(h, toks.count)
    if model in BPE_MODELS and h.values.get("tokenizer.ggml.pre") != "kimi-k2":
        m = h.values.get("tokenizer.ggml.merges")
        if not (isinstance(m, ArrayValue) and m.etype == T.STRING):
            yield problem("merges", "tokenizer.ggml.merges", f"a {model} vocabulary needs tokenizer.ggml.merges")
    yield from _tokens(h, model, toks)
    yield from _special(h, model, toks.count)


def _arrays(h: Header, n: int) -> Iterator[Problem]:
    for k, ok in (("tokenizer.ggml.scores", (T.FLOAT32, T.INT32)), ("tokenizer.ggml.token_type", (T.INT32,))):
        v = h.values.get(k)
        if v is None:
            continue
        if not isinstance(v, ArrayValue) or v.etype not in ok:
            yield problem("token-arrays", k, f"{k} is not an array of {' or '.join(t.name.lower() for t in ok)}")
        elif v.count < n:
            yield problem("token-arrays", k, f"{k} has {v.count} entries for {n} tokens")


def _tokens(h: Header, model: str, toks: ArrayValue) -> Iterator[Problem]:
    items: list[bytes] = toks.items  # type: ignore[assignment]
    unique = set(items)
    if len(unique) != len(items) or b"" in unique:  # (llama.cpp names an empty token "[EMPTY_i]")
        texts = [t if t else f"[EMPTY_{i}]".encode() for i, t in enumerate(items)]
        seen: set[bytes] = set()
        dup = next((t for t in texts if t in seen or seen.add(t)), None)  # type: ignore[func-returns-value]
        if dup is not None:
            yield problem("duplicate-token", "tokenizer.ggml.tokens", f"tokenizer.ggml.tokens holds {dup!r} twice")
    types = h.values.get("tokenizer.ggml.token_type")
    if isinstance(types, ArrayValue) and types.etype == T.INT32 and types.count >= toks.count:
        for i in np.flatnonzero(np.asarray(types.items[: toks.count]) == TOKEN_TYPE_BYTE):
            if model == "bert" or len(items[i]) < 3:
                why = "in a bert vocabulary" if model == "bert" else "whose text is not <0xXX>"
                yield problem(
                    "byte-token", "tokenizer.ggml.token_type", f"token {i} ({items[i]!r}) is a byte token {why}"
                )
                return


def _special(h: Header, model: str, n: int) -> Iterator[Problem]:
    adds = list(_ADDS.get(model, ()))
    for what in ("bos", "eos"):
        flag = h.values.get(f"tokenizer.ggml.add_{what}_token")
        if flag is True and what not in adds:
            adds.append(what)
        elif flag is False and what in adds and model != "bert":
            adds.remove(what)
    for what in adds:
        k = f"tokenizer.ggml.{what}_token_id"
        given = h.values.get(k) if h.types.get(k) == T.UINT32 else None
        default = _DEFAULT_ID.get(model if model in _DEFAULT_ID else "gpt2", {}).get(what, -1)
        if not ((given is not None and given < n) or 0 <= default < n):
            yield problem(
                "special-tokens",
                k,
                f"the tokenizer adds a {what.upper()} token but {k} = {given} is not one of the {n} tokens",
            )
