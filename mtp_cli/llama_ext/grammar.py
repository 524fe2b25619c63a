"""llama.cpp's grammar sampler (GBNF) as a constraint on logits rows, and llama-cpp-python's JSON
schema to GBNF conversion (the one llama-server uses, ported).

llama.cpp aborts the process when its grammar accepts a token it does not allow (or an end of
generation before it is complete): `Grammar.mask` leaves only allowed tokens, and a row where none is
allowed is a LlamaError, so `accept` only ever sees a token the grammar allows.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as _C
from llama_cpp import llama_grammar as _G

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.handles import Model, Sampler

JSON_GRAMMAR: str = _G.JSON_GBNF  # any JSON object (response_format json_object)
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # struct llama_token_data
assert _TOKEN_DATA.itemsize == ctypes.sizeof(_C.llama_token_data)


def json_schema_grammar(schema: Any) -> str:
    """GBNF for the JSON values `schema` describes; ValueError naming what it cannot convert."""
    try:
        return str(_G.json_schema_to_gbnf(json.dumps(schema)))
    except Exception as e:  # (the converter raises bare exceptions on what it does not support)
        raise ValueError(f"cannot turn this JSON schema into a grammar: {e}") from None


class Grammar:
    """One generation's grammar state: `mask(row)` sets every token it does not allow next to -inf
    (in place), `accept(token)` advances it. Close it (or its with block) to free it."""

    def __init__(self, model: Model, gbnf: str, root: str = "root"):
        vocab = _C.llama_model_get_vocab(model)
        ptr = _C.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        if not ptr:
            raise LlamaError("the grammar does not parse (llama.cpp's GBNF), or has no rule `root`")
        self._sampler = Sampler(ptr)
        n = int(_C.llama_vocab_n_tokens(vocab))
        self._cands = np.zeros(n, dtype=_TOKEN_DATA)
        self._cands["id"] = np.arange(n, dtype=np.int32)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def _apply(self, cands: np.ndarray) -> None:
        arr = _C.llama_token_data_array(
            cands.ctypes.data_as(ctypes.POINTER(_C.llama_token_data)), len(cands), -1, False
        )
        _C.llama_sampler_apply(self._sampler, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        """Whether the grammar allows `token` next (one candidate: cheap)."""
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, row: np.ndarray) -> None:
        """-inf for every token of `row` (a full vocabulary's logits) the grammar does not allow next."""
        c = self._cands[: row.shape[0]]
        c["logit"] = row
        self._apply(c)
        row[:] = c["logit"]
        if not np.isfinite(row.max()):
            raise LlamaError("the grammar allows no token of this vocabulary here")

    def copy(self) -> Grammar:
        """An independent copy of the state (llama_sampler_clone): advance it without touching this one."""
        ptr = _C.llama_sampler_clone(self._sampler)
        if not ptr:
            raise LlamaError("llama.cpp could not copy the grammar")
        twin = Grammar.__new__(Grammar)
        twin._sampler, twin._cands, twin._one = Sampler(ptr), self._cands, self._one  # (scratch: one thread)
        return twin

    def accept(self, token: int) -> None:
        _C.llama_sampler_accept(self._sampler, int(token))

    def close(self) -> None:
        self._sampler.close()

    def __enter__(self) -> Grammar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Grammar", "JSON_GRAMMAR", "json_schema_grammar"]
