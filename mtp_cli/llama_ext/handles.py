"""Owning handles for llama.cpp's models, contexts and samplers.

Each wraps one C pointer, passes it to the bindings as itself (ctypes' `_as_parameter_`: a closed
handle raises there, a LlamaError inside ctypes' ArgumentError, instead of handing llama.cpp a freed
pointer) and frees it once with close(). The free order is structural: a model closes its contexts
first, and a context closes first every context that reads its memory (an MTP context created with
it as ctx_other).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from llama_cpp import llama_cpp as _C

from mtp_cli.errors import LlamaError


@dataclass(frozen=True)
class ModelInfo:
    """What llama.cpp cannot tell us about a loaded model but we must know to avoid its aborts."""

    path: Path
    load_mtp: bool
    n_nextn: int  # {arch}.nextn_predict_layers
    mtp_only: bool  # an MTP-only sidecar: heads (+ shared embeddings/norm/output), no trunk


class _Handle:
    _what = "handle"

    def __init__(self, ptr: Any, free: Callable[[Any], None]):
        self._ptr: Any = ptr
        self._free = free

    @property
    def _as_parameter_(self) -> Any:
        if not self._ptr:
            raise LlamaError(f"this {self._what} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return not self._ptr

    def _release(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._free(ptr)

    def close(self) -> None:
        self._release()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Model(_Handle):
    """A loaded llama_model (load_model) and what the loader knew of its file."""

    _what = "model"

    def __init__(self, ptr: Any, info: ModelInfo):
        super().__init__(ptr, _C.llama_model_free)
        self.info = info
        self.contexts: list[Context] = []

    def close(self) -> None:
        for c in reversed(list(self.contexts)):
            c.close()
        self._release()


class Context(_Handle):
    """A llama_context (create_context) on `model`; `reads`: the context whose memory it was
    created to read (ctx_other), which outlives it."""

    _what = "context"

    def __init__(self, ptr: Any, model: Model, reads: Optional[Context] = None):
        super().__init__(ptr, _C.llama_free)
        self.model, self.reads = model, reads
        self.readers: list[Context] = []
        model.contexts.append(self)
        if reads is not None:
            reads.readers.append(self)

    def close(self) -> None:
        if self.closed:
            return
        for r in reversed(list(self.readers)):
            r.close()
        self._release()
        self.model.contexts.remove(self)
        if self.reads is not None:
            self.reads.readers.remove(self)


class Sampler(_Handle):
    """A llama_sampler (a chain: llama_ext.vocab.sampler_chain)."""

    _what = "sampler"

    def __init__(self, ptr: Any):
        super().__init__(ptr, _C.llama_sampler_free)


__all__ = ["Model", "Context", "Sampler", "ModelInfo"]
