"""Tensors against the header: the shapes every architecture's loader derives from it
(src/llama-model-loader.cpp check_tensor_dims), and no block past block_count."""

from __future__ import annotations

from collections.abc import Iterator

from gguf_tools.loadable.header import Header, Problem, check, problem
from gguf_tools.names import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, block_index

_ASSISTANT = ("gemma4-assistant",)  # its token embedding has the drafter's width, not embedding_length's


@check
def shapes(h: Header) -> Iterator[Problem]:
    e = h.n_embd
    toks = h.tokens()
    n_vocab = toks.count if toks is not None else None
    want: dict[str, tuple[int | None, ...]] = {OUTPUT_NORM: (e,)}
    if h.arch not in _ASSISTANT:
        want |= {TOKEN_EMBD: (e, n_vocab), OUTPUT: (e, n_vocab)}
    for i in range(h.n_layers):
        want[f"blk.{i}.attn_norm.weight"] = (e,)
        if i >= h.n_layers - h.n_nextn:
            want |= {
                f"blk.{i}.nextn.eh_proj.weight": (2 * e, e),
                f"blk.{i}.nextn.enorm.weight": (e,),
                f"blk.{i}.nextn.hnorm.weight": (e,),
            }
    for name, shape in want.items():
        t = h.tensors.get(name)
        if t is not None and e and not _fits(t.shape, shape):
            got = list(t.shape)
            yield problem(
                "tensor-shape",
                name,
                f"tensor {name!r} is {got}, the header makes it {[d if d is not None else '?' for d in shape]}",
            )
            return


def _fits(got: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    padded = tuple(got) + (1,) * (len(want) - len(got))
    return all(w is None or g == w for g, w in zip(padded, want)) and all(d == 1 for d in padded[len(want) :])


@check
def blocks(h: Header) -> Iterator[Problem]:
    if not h.has("block_count"):
        return
    for name in h.tensors:
        i = block_index(name)
        if i is not None and i >= h.n_layers:
            k = h.key("block_count")
            yield problem("blocks", name, f"tensor {name!r} is in block {i}, past {k} = {h.n_layers}")
            return
