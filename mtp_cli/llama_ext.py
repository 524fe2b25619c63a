"""The one wrapper around llama.cpp's MTP plumbing (llama-cpp-python 0.3.36).

`llama_cpp.llama_cpp_ext` holds staging bindings (nextn embeddings, nextn layer offset,
ctx_other) that are not a stable API; this is the only module that imports it. Everything here
is a thin, typed function over the C API; the speculative runtime builds on it.

MTP call sequence (what llama.cpp's common_speculative_impl_draft_mtp does):

    tgt_model = load_model(path, load_mtp=True)              # full model: trunk + head
    tgt = create_context(tgt_model, n_rs_seq=N)               # N >= draft length for hybrid archs
    dft = create_context(tgt_model, ctx_type=CTX_TYPE_MTP, ctx_other=tgt, n_rs_seq=0)
    #  (or a separate MTP-only sidecar: dft_model = load_model(sidecar, load_mtp=True);
    #   create_context(dft_model, ctx_type=CTX_TYPE_MTP, ...); the target model then needs no heads)
    set_embeddings_nextn(tgt, True, False)    # target: one h row per batch token
    set_embeddings_nextn(dft, True, True)     # draft: h rows for output rows only (use _ith)
    decode(tgt, prompt batch)  -> h = get_embeddings_nextn(tgt, n_prompt)
    MTP input at position p = token x_p with the target's h row of position p-1;
    the first position pairs with a zero / pending row.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from llama_cpp import llama_cpp as _C
from llama_cpp import llama_cpp_ext as _X

from gguf_tools.gguf_file import open_gguf

CTX_TYPE_TARGET: int = int(_C.LLAMA_CONTEXT_TYPE_DEFAULT)
CTX_TYPE_MTP: int = int(_C.LLAMA_CONTEXT_TYPE_MTP)

ModelPtr = Any  # llama_cpp.llama_model_p (a ctypes void pointer)
ContextPtr = Any  # llama_cpp.llama_context_p

_HAS_N_RS_SEQ = any(f[0] == "n_rs_seq" for f in _C.llama_context_params._fields_)
_HAS_N_OUTPUTS_MAX = any(f[0] == "n_outputs_max" for f in _C.llama_context_params._fields_)


class LlamaError(RuntimeError):
    """llama.cpp refused: a NULL model/context, a failed decode, missing nextn embeddings."""


@dataclass(frozen=True)
class ModelInfo:
    """What llama.cpp cannot tell us about a loaded model but we must know to avoid its aborts."""

    path: Path
    load_mtp: bool
    n_nextn: int  # {arch}.nextn_predict_layers
    mtp_only: bool  # an MTP-only sidecar: heads (+ shared embeddings/norm/output), no trunk


_models: dict[int, ModelInfo] = {}


def _probe_gguf(path: Path) -> tuple[int, bool]:
    """(nextn_predict_layers, mtp_only) from the bounds-checked header, as llama.cpp's loader decides
    (mtp_only = nextn > 0 and no blk.0.attn_norm.weight). Raises BadFileError before llama.cpp sees a bad file."""
    gf = open_gguf(path)
    n_nextn = gf.layout().nextn_layers
    return n_nextn, n_nextn > 0 and "blk.0.attn_norm.weight" not in gf.tensors


def model_info(model: ModelPtr) -> Optional[ModelInfo]:
    """The ModelInfo recorded by load_model (None for a model loaded elsewhere)."""
    return _models.get(_addr(model))


def _addr(ptr: Any) -> int:
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


# ---------------------------------------------------------------------------------------------
# backend + logging
# ---------------------------------------------------------------------------------------------

_backend_ready = False
_log_cb: Any = None  # keep the ctypes callback alive


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        _C.llama_backend_init()
        _backend_ready = True


def quiet_logs(quiet: bool = True) -> None:
    """Silence llama.cpp's logging (quiet=True) or restore its default stderr logger."""
    global _log_cb
    if quiet:
        @_C.llama_log_callback
        def _drop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover
            return None

        _log_cb = _drop
        _C.llama_log_set(_log_cb, ctypes.c_void_p(0))
    else:
        _log_cb = None
        _C.llama_log_set(_C.llama_log_callback(), ctypes.c_void_p(0))


# ---------------------------------------------------------------------------------------------
# models and contexts
# ---------------------------------------------------------------------------------------------


def load_model(path: str | os.PathLike[str], *, load_mtp: bool = False, n_gpu_layers: int = 0,
               use_mmap: bool = True) -> ModelPtr:
    """Load a GGUF. `load_mtp=True` also loads the MTP head blocks (needed for an MTP context,
    and for an MTP-only sidecar, whose heads are all it has). Raises LlamaError on failure."""
    init_backend()
    p = Path(path)
    if not p.is_file():
        raise LlamaError(f"{p}: no such file")
    params = _C.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else int(n_gpu_layers)
    params.load_mtp = bool(load_mtp)
    if not use_mmap:
        params.load_mode = _C.LLAMA_LOAD_MODE_NONE
    n_nextn, mtp_only = _probe_gguf(p)
    if mtp_only and not load_mtp:
        raise LlamaError(f"{p}: an MTP-only sidecar holds nothing but heads; load it with load_mtp=True")
    model = _C.llama_model_load_from_file(str(p).encode("utf-8"), params)
    if not model:
        raise LlamaError(f"{p}: llama.cpp failed to load the model")
    _models[_addr(model)] = ModelInfo(p, bool(load_mtp), n_nextn, mtp_only)
    return model


def free_model(model: ModelPtr) -> None:
    if model:
        _models.pop(_addr(model), None)
        _C.llama_model_free(model)


def create_context(
    model: ModelPtr,
    *,
    n_ctx: int = 512,
    n_batch: int = 512,
    n_ubatch: Optional[int] = None,
    n_threads: Optional[int] = None,
    n_threads_batch: Optional[int] = None,
    ctx_type: int = CTX_TYPE_TARGET,
    ctx_other: Optional[ContextPtr] = None,
    n_rs_seq: int = 0,
    n_seq_max: int = 1,
    n_outputs_max: int = 0,
    embeddings: bool = False,
) -> ContextPtr:
    """Create a context. For an MTP draft context pass ctx_type=CTX_TYPE_MTP and
    ctx_other=<target context> (llama.cpp keeps ctx_other only for archs that share the
    target's memory, e.g. gemma4-assistant; for qwen35/glm4moe the MTP context has its own KV).
    `n_rs_seq` = recurrent-state snapshots per sequence for rollback (target of a hybrid arch
    such as qwen35: >= the draft length; 0 for the MTP context). Raises LlamaError on NULL."""
    init_backend()
    info = model_info(model)
    if ctx_type == CTX_TYPE_MTP:
        if n_layer_nextn(model) == 0:
            raise LlamaError("an MTP context needs a model with MTP head blocks (nextn_predict_layers > 0)")
        if info is not None and not info.load_mtp:
            # llama.cpp would GGML_ASSERT (abort the process) on the missing nextn tensors
            raise LlamaError(f"{info.path}: loaded without load_mtp=True; cannot create an MTP context")
    elif info is not None and info.mtp_only:
        # llama.cpp would segfault building the trunk graph of a model with no trunk
        raise LlamaError(f"{info.path}: an MTP-only sidecar runs only in an MTP context (ctx_type=CTX_TYPE_MTP)")
    params = _C.llama_context_default_params()
    params.n_ctx = int(n_ctx)
    params.n_batch = min(int(n_batch), int(n_ctx)) if n_ctx else int(n_batch)
    params.n_ubatch = min(int(n_ubatch), params.n_batch) if n_ubatch else params.n_batch
    params.n_seq_max = int(n_seq_max)
    threads = n_threads if n_threads is not None else default_threads()
    params.n_threads = int(threads)
    params.n_threads_batch = int(n_threads_batch if n_threads_batch is not None else threads)
    params.ctx_type = int(ctx_type)
    params.embeddings = bool(embeddings)
    if _HAS_N_RS_SEQ:
        params.n_rs_seq = int(n_rs_seq)
    elif n_rs_seq:
        raise LlamaError("this llama.cpp build has no n_rs_seq context parameter")
    if _HAS_N_OUTPUTS_MAX and n_outputs_max:
        params.n_outputs_max = int(n_outputs_max)
    if ctx_other is not None:
        params.ctx_other = ctx_other
    ctx = _C.llama_init_from_model(model, params)
    if not ctx:
        kind = "MTP" if ctx_type == CTX_TYPE_MTP else "target"
        raise LlamaError(f"llama.cpp failed to create the {kind} context"
                         + (" (model has no MTP layers, or was loaded without load_mtp)" if kind == "MTP" else ""))
    return ctx


def free_context(ctx: ContextPtr) -> None:
    if ctx:
        _C.llama_free(ctx)


def context_model(ctx: ContextPtr) -> ModelPtr:
    return _C.llama_get_model(ctx)


def n_embd_out(model: ModelPtr) -> int:
    """Width of an h (nextn) row: n_embd_out, falling back to n_embd."""
    n = int(_C.llama_model_n_embd_out(model))
    return n if n > 0 else int(_C.llama_model_n_embd(model))


def n_layer_nextn(model: ModelPtr) -> int:
    return int(_C.llama_model_n_layer_nextn(model))


def n_vocab(model: ModelPtr) -> int:
    return int(_C.llama_vocab_n_tokens(_C.llama_model_get_vocab(model)))


def n_rs_seq(ctx: ContextPtr) -> int:
    return int(_C.llama_n_rs_seq(ctx)) if hasattr(_C, "llama_n_rs_seq") else 0


# ---------------------------------------------------------------------------------------------
# the staging MTP API
# ---------------------------------------------------------------------------------------------


def set_embeddings_nextn(ctx: ContextPtr, enabled: bool, masked: bool) -> None:
    """Target: (True, False) -> one h row per batch token. MTP draft: (True, True) -> h rows for
    output rows only (read them with get_embeddings_nextn_ith)."""
    _X.llama_set_embeddings_nextn(ctx, bool(enabled), bool(masked))


def get_embeddings_nextn(ctx: ContextPtr, n_rows: int, *, copy: bool = True,
                         n_embd: Optional[int] = None) -> np.ndarray:
    """The first `n_rows` h rows of the last decode, shape (n_rows, n_embd_out), float32.
    copy=False returns a view into llama.cpp's buffer, valid until the next decode. Pass n_embd
    (= n_embd_out of the model) to skip looking it up."""
    ptr = _X.llama_get_embeddings_nextn(ctx)
    if not ptr:
        raise LlamaError("no nextn embeddings (set_embeddings_nextn not enabled, or nothing decoded)")
    n = n_embd if n_embd else n_embd_out(context_model(ctx))
    arr = np.ctypeslib.as_array(ptr, shape=(int(n_rows), n))
    return arr.copy() if copy else arr


def get_embeddings_nextn_ith(ctx: ContextPtr, i: int, *, copy: bool = True,
                             n_embd: Optional[int] = None) -> np.ndarray:
    """The h row of batch index `i` (negative: from the end of the outputs), shape (n_embd_out,)."""
    ptr = _X.llama_get_embeddings_nextn_ith(ctx, int(i))
    if not ptr:
        raise LlamaError(f"no nextn embedding row for batch index {i}")
    n = n_embd if n_embd else n_embd_out(context_model(ctx))
    arr = np.ctypeslib.as_array(ptr, shape=(n,))
    return arr.copy() if copy else arr


def set_nextn_layer_offset(ctx: ContextPtr, offset: int) -> None:
    """Select which appended head block the MTP graph runs (chained-head archs, e.g. step35)."""
    _X.llama_set_nextn_layer_offset(ctx, int(offset))


def get_ctx_other(ctx: ContextPtr) -> Optional[ContextPtr]:
    """The ctx_other llama.cpp kept (None unless the arch shares the target's memory)."""
    other = _X.llama_get_ctx_other(ctx)
    return other if other else None


# ---------------------------------------------------------------------------------------------
# batches and decoding
# ---------------------------------------------------------------------------------------------


class Batch:
    """A llama_batch whose arrays are owned by numpy: tokens, and optionally one h row per token
    (the MTP context's input: token x_p plus the target's h row of position p-1). One sequence
    id per token. Never passed to llama_batch_free."""

    def __init__(self, capacity: int, n_embd: int = 0):
        self.capacity = int(capacity)
        self.n_embd = int(n_embd)
        self.tokens = np.zeros(self.capacity, dtype=np.int32)
        self.pos = np.zeros(self.capacity, dtype=np.int32)
        self.n_seq_id = np.ones(self.capacity, dtype=np.int32)
        self.seq_ids = np.zeros(self.capacity, dtype=np.int32)
        self.logits = np.zeros(self.capacity, dtype=np.int8)
        self.h = np.zeros((self.capacity, max(self.n_embd, 1)), dtype=np.float32)
        seq_ptr_t = ctypes.POINTER(_C.llama_seq_id)
        self._seq_ptrs = (seq_ptr_t * self.capacity)(
            *[ctypes.cast(self.seq_ids.ctypes.data + 4 * k, seq_ptr_t) for k in range(self.capacity)]
        )
        self.n_tokens = 0
        self._llama_batch: Any = None  # built once: the numpy arrays never move

    def clear(self) -> None:
        self.n_tokens = 0

    def add_many(self, tokens: Any, pos0: int, *, seq_id: int = 0, logits_last: bool = False,
                 h: Optional[np.ndarray] = None) -> int:
        """Append len(tokens) tokens at positions pos0, pos0+1, ... (vectorised); `h` is a
        (len(tokens), n_embd) block iff the batch carries h rows. Only the last appended token
        gets logits when logits_last. Returns the batch index of the last appended token."""
        n = len(tokens)
        k = self.n_tokens
        if n == 0:
            return k - 1
        if k + n > self.capacity:
            raise LlamaError(f"batch capacity {self.capacity} exceeded")
        self.tokens[k:k + n] = tokens
        self.pos[k:k + n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.seq_ids[k:k + n] = seq_id
        self.logits[k:k + n] = 0
        if logits_last:
            self.logits[k + n - 1] = 1
        if self.n_embd:
            if h is None:
                raise LlamaError("this batch carries h rows: pass h=")
            self.h[k:k + n] = h
        self.n_tokens = k + n
        return k + n - 1

    def add(self, token: int, pos: int, *, seq_id: int = 0, logits: bool = False,
            h: Optional[np.ndarray] = None) -> int:
        """Append one token; returns its batch index. `h` (length n_embd) is required iff the
        batch was created with n_embd > 0."""
        k = self.n_tokens
        if k >= self.capacity:
            raise LlamaError(f"batch capacity {self.capacity} exceeded")
        self.tokens[k] = token
        self.pos[k] = pos
        self.seq_ids[k] = seq_id
        self.logits[k] = 1 if logits else 0
        if self.n_embd:
            if h is None:
                raise LlamaError("this batch carries h rows: pass h=")
            self.h[k] = h
        self.n_tokens = k + 1
        return k

    def as_llama_batch(self) -> Any:
        b = self._llama_batch
        if b is not None:
            b.n_tokens = self.n_tokens
            return b
        b = _C.llama_batch()
        b.n_tokens = self.n_tokens
        b.token = self.tokens.ctypes.data_as(ctypes.POINTER(_C.llama_token))
        b.embd = (self.h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if self.n_embd
                  else ctypes.POINTER(ctypes.c_float)())
        b.pos = self.pos.ctypes.data_as(ctypes.POINTER(_C.llama_pos))
        b.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(_C.llama_seq_id)))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._llama_batch = b
        return b


def decode(ctx: ContextPtr, batch: Batch) -> None:
    """llama_decode; raises LlamaError on a non-zero return."""
    if batch.n_tokens == 0:
        return
    n_batch = int(_C.llama_n_batch(ctx))
    if batch.n_tokens > n_batch:  # llama.cpp would GGML_ASSERT (abort the process)
        raise LlamaError(f"batch of {batch.n_tokens} tokens exceeds the context's n_batch={n_batch}")
    rc = int(_C.llama_decode(ctx, batch.as_llama_batch()))
    if rc != 0:
        raise LlamaError(f"llama_decode failed with code {rc}")


def logits_ith(ctx: ContextPtr, i: int, *, copy: bool = True) -> np.ndarray:
    """Logits of batch index `i` (which must have been marked for output), shape (n_vocab,)."""
    ptr = _C.llama_get_logits_ith(ctx, int(i))
    if not ptr:
        raise LlamaError(f"no logits for batch index {i}")
    arr = np.ctypeslib.as_array(ptr, shape=(n_vocab(context_model(ctx)),))
    return arr.copy() if copy else arr


def logits_rows(ctx: ContextPtr, n_rows: int, n_vocab_: int) -> np.ndarray:
    """A (n_rows, n_vocab) float32 VIEW of the last decode's logits, in output order (row i is
    batch index i when every batch token was marked for output). Valid until the next decode;
    cheaper than logits_ith when the caller already knows n_vocab."""
    ptr = _C.llama_get_logits(ctx)
    if not ptr:
        raise LlamaError("no logits (nothing decoded with output rows)")
    return np.ctypeslib.as_array(ptr, shape=(int(n_rows), int(n_vocab_)))


def memory_seq_pos_max(ctx: ContextPtr, seq_id: int = 0) -> int:
    """Largest position held for the sequence (-1 when empty)."""
    return int(_C.llama_memory_seq_pos_max(_C.llama_get_memory(ctx), int(seq_id)))


def memory_seq_rm(ctx: ContextPtr, seq_id: int, p0: int, p1: int = -1) -> bool:
    """Remove cells [p0, p1) of a sequence (p1=-1: to the end); False if llama.cpp refuses
    (a recurrent state that cannot roll back that far)."""
    return bool(_C.llama_memory_seq_rm(_C.llama_get_memory(ctx), int(seq_id), int(p0), int(p1)))


def memory_clear(ctx: ContextPtr, data: bool = True) -> None:
    """Drop every sequence (KV cells and recurrent states). Note: llama_memory_seq_rm with
    seq_id=-1 is refused by recurrent/hybrid memory (qwen35); use this or a concrete seq id.
    data=False only marks the cells free (no zeroing of the buffers: cheaper)."""
    _C.llama_memory_clear(_C.llama_get_memory(ctx), bool(data))


def n_ctx(ctx: ContextPtr) -> int:
    """The context's actual size in tokens (llama.cpp may round the requested n_ctx)."""
    return int(_C.llama_n_ctx(ctx))


def n_batch(ctx: ContextPtr) -> int:
    return int(_C.llama_n_batch(ctx))


def model_has_recurrent_state(model: ModelPtr) -> bool:
    """True for recurrent (Mamba/RWKV) and hybrid (qwen35 gated delta net) models: their state
    rolls back only through n_rs_seq snapshots or a saved state, not by dropping KV cells."""
    return bool(_C.llama_model_is_recurrent(model)) or bool(_C.llama_model_is_hybrid(model))


def model_n_ctx_train(model: ModelPtr) -> int:
    return int(_C.llama_model_n_ctx_train(model))


def default_threads() -> int:
    """The thread count create_context uses when n_threads is None."""
    return max(1, min(os.cpu_count() or 1, 4))


def supports_gpu_offload() -> bool:
    return bool(_C.llama_supports_gpu_offload())


def system_info() -> str:
    """llama.cpp's build/CPU feature line (e.g. "CPU : AVX2 = 1 | ...")."""
    return bytes(_C.llama_print_system_info() or b"").decode("utf-8", "replace").strip()


# ---------------------------------------------------------------------------------------------
# sequence state checkpoints (recurrent rollback beyond what n_rs_seq snapshots allow)
# ---------------------------------------------------------------------------------------------

STATE_PARTIAL_ONLY: int = int(_C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)


class SeqCheckpoint:
    """A reusable buffer holding one sequence's state. With partial=True (the default) only the
    recurrent part of a hybrid memory is saved: the attention KV rolls back with memory_seq_rm."""

    def __init__(self, ctx: ContextPtr, seq_id: int = 0, *, partial: bool = True):
        self.ctx = ctx
        self.seq_id = int(seq_id)
        self.flags = STATE_PARTIAL_ONLY if partial else 0
        self.buf = np.zeros(0, dtype=np.uint8)
        self.n = 0

    def save(self) -> None:
        size = int(_C.llama_state_seq_get_size_ext(self.ctx, self.seq_id, self.flags))
        if size > self.buf.size:
            self.buf = np.zeros(size, dtype=np.uint8)
        ptr = self.buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        self.n = int(_C.llama_state_seq_get_data_ext(self.ctx, ptr, size, self.seq_id, self.flags))
        if self.n == 0:
            raise LlamaError("llama_state_seq_get_data_ext saved nothing")

    def restore(self) -> None:
        if self.n == 0:
            raise LlamaError("no checkpoint saved")
        ptr = self.buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if int(_C.llama_state_seq_set_data_ext(self.ctx, ptr, self.n, self.seq_id, self.flags)) == 0:
            raise LlamaError("llama_state_seq_set_data_ext failed to restore the checkpoint")


# ---------------------------------------------------------------------------------------------
# vocabulary
# ---------------------------------------------------------------------------------------------


def is_eog(model: ModelPtr, token: int) -> bool:
    return bool(_C.llama_vocab_is_eog(_C.llama_model_get_vocab(model), int(token)))


def vocab_type(model: ModelPtr) -> int:
    return int(_C.llama_vocab_type(_C.llama_model_get_vocab(model)))


def vocab_special(model: ModelPtr) -> tuple[int, int]:
    """(bos, eos) token ids (-1 when the vocabulary has none)."""
    v = _C.llama_model_get_vocab(model)
    return int(_C.llama_vocab_bos(v)), int(_C.llama_vocab_eos(v))


def token_text(model: ModelPtr, token: int) -> bytes:
    """The vocabulary entry of `token` as stored (e.g. SentencePiece '\u2581the'), raw bytes."""
    return _C.llama_vocab_get_text(_C.llama_model_get_vocab(model), int(token)) or b""


class PieceDecoder:
    """token id -> its piece as bytes (llama_token_to_piece, special tokens not rendered), with a
    reusable buffer; pair with codecs' incremental UTF-8 decoder to stream text."""

    def __init__(self, model: ModelPtr, *, render_special: bool = False):
        self.vocab = _C.llama_model_get_vocab(model)
        self.special = bool(render_special)
        self.buf = ctypes.create_string_buffer(64)

    def __call__(self, token: int) -> bytes:
        n = int(_C.llama_token_to_piece(self.vocab, int(token), self.buf, len(self.buf), 0, self.special))
        if n < 0:
            self.buf = ctypes.create_string_buffer(-n + 8)
            n = int(_C.llama_token_to_piece(self.vocab, int(token), self.buf, len(self.buf), 0, self.special))
        return self.buf.raw[:max(n, 0)]


# ---------------------------------------------------------------------------------------------
# samplers (llama.cpp's own chain, so the distribution is exactly llama.cpp's)
# ---------------------------------------------------------------------------------------------

SamplerPtr = Any
DEFAULT_SEED: int = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed


def sampler_chain(*, top_k: int, top_p: float, min_p: float, temp: float, seed: int) -> SamplerPtr:
    """top_k -> top_p -> min_p -> temp -> dist(seed), llama.cpp's default order for these
    samplers (common_sampler). Free with sampler_free."""
    params = _C.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = _C.llama_sampler_chain_init(params)
    if not chain:
        raise LlamaError("llama_sampler_chain_init failed")
    if top_k > 0:
        _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_top_k(int(top_k)))
    if top_p < 1.0:
        _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_top_p(float(top_p), 1))
    if min_p > 0.0:
        _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_min_p(float(min_p), 1))
    _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_temp(float(temp)))
    _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))
    return chain


def sampler_sample(smpl: SamplerPtr, ctx: ContextPtr, i: int) -> int:
    """Sample from the logits of batch index `i` (and let the chain accept the token)."""
    return int(_C.llama_sampler_sample(smpl, ctx, int(i)))


def sampler_reset(smpl: SamplerPtr) -> None:
    _C.llama_sampler_reset(smpl)


def sampler_free(smpl: SamplerPtr) -> None:
    if smpl:
        _C.llama_sampler_free(smpl)


def tokenize(model: ModelPtr, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
    vocab = _C.llama_model_get_vocab(model)
    data = text.encode("utf-8")
    cap = len(data) + 8
    buf = (_C.llama_token * cap)()
    n = int(_C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special))
    if n < 0:
        cap = -n
        buf = (_C.llama_token * cap)()
        n = int(_C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special))
    if n < 0:
        raise LlamaError("llama_tokenize failed")
    return list(buf[:n])


def detokenize(model: ModelPtr, tokens: list[int], *, remove_special: bool = True,
               unparse_special: bool = False) -> str:
    vocab = _C.llama_model_get_vocab(model)
    arr = (_C.llama_token * max(1, len(tokens)))(*tokens)
    cap = 16 * len(tokens) + 16
    buf = ctypes.create_string_buffer(cap)
    n = int(_C.llama_detokenize(vocab, arr, len(tokens), buf, cap, remove_special, unparse_special))
    if n < 0:
        cap = -n
        buf = ctypes.create_string_buffer(cap)
        n = int(_C.llama_detokenize(vocab, arr, len(tokens), buf, cap, remove_special, unparse_special))
    if n < 0:
        raise LlamaError("llama_detokenize failed")
    return buf.raw[:n].decode("utf-8", errors="replace")


__all__ = [
    "CTX_TYPE_TARGET", "CTX_TYPE_MTP", "LlamaError", "ModelInfo", "model_info", "Batch", "init_backend", "quiet_logs",
    "load_model", "free_model", "create_context", "free_context", "context_model", "n_embd_out",
    "n_layer_nextn", "n_vocab", "n_rs_seq", "set_embeddings_nextn", "get_embeddings_nextn",
    "get_embeddings_nextn_ith", "set_nextn_layer_offset", "get_ctx_other", "decode", "logits_ith",
    "memory_seq_rm", "memory_clear", "tokenize", "detokenize",
    "logits_rows", "memory_seq_pos_max", "n_ctx", "n_batch", "model_has_recurrent_state", "model_n_ctx_train",
    "default_threads", "supports_gpu_offload", "system_info",
    "STATE_PARTIAL_ONLY", "SeqCheckpoint", "is_eog", "vocab_type", "vocab_special", "token_text", "PieceDecoder",
    "SamplerPtr", "DEFAULT_SEED", "sampler_chain", "sampler_sample", "sampler_reset", "sampler_free",
]
