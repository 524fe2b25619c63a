"""llama_ext's owning handles: the free order is structural (a model closes its contexts, a context
the contexts that read its memory, first), and a closed handle is an error naming it (ctypes wraps
the LlamaError in its ArgumentError), not a freed pointer handed to llama.cpp."""

from __future__ import annotations

import ctypes

import pytest

from mtp_cli import llama_ext as lx
from tests.support import Pair


def test_closing_a_model_closes_its_contexts_readers_first(tiny_models, monkeypatch):
    pair = Pair(tiny_models("glm4moe")["full"], arch="glm4moe")
    freed: list[str] = []
    names = {id(pair.tgt): "target", id(pair.dft): "mtp"}
    for ctx in (pair.tgt, pair.dft):
        release = ctx._release
        monkeypatch.setattr(ctx, "_release", lambda c=ctx, r=release: (freed.append(names[id(c)]), r()))
    assert pair.dft.reads is pair.tgt and pair.tgt.readers == [pair.dft]
    assert pair.tm.contexts == [pair.tgt, pair.dft]
    pair.tm.close()
    assert freed == ["mtp", "target"] and pair.tm.closed and pair.tgt.closed and pair.dft.closed
    assert pair.tm.contexts == [] and pair.tgt.readers == []
    pair.tm.close()  # (twice: nothing)
    with pytest.raises(ctypes.ArgumentError, match="LlamaError: this context is closed"):
        lx.n_ctx(pair.tgt)
    with pytest.raises(ctypes.ArgumentError, match="LlamaError: this model is closed"):
        lx.n_vocab(pair.tm)


def test_a_target_context_closed_alone_takes_its_readers_and_leaves_the_model(tiny_models):
    pair = Pair(tiny_models("glm4moe")["full"], arch="glm4moe")
    with pair.tm:
        pair.tgt.close()
        assert pair.dft.closed and not pair.tm.closed and pair.tm.contexts == []
        with lx.create_context(pair.tm, n_ctx=64, n_batch=8) as again:
            assert lx.n_ctx(again) >= 64
        assert again.closed and pair.tm.contexts == []
    assert pair.tm.closed
