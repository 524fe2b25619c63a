"""Batches, decoding, logits, memory (KV cells and recurrent state) and state checkpoints."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

import numpy as np
from llama_cpp import llama_cpp as _C

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.handles import Context
from mtp_cli.llama_ext.models import n_vocab
from mtp_cli.llama_ext.views import address_getter, float_view

logits_address = address_getter(_C.llama_get_logits)


class Batch:
    """A llama_batch whose arrays are owned by numpy: tokens, and optionally one h row per token
    (the MTP context's input: token x_p plus the target's h row of position p-1). One sequence
    id per token (`seq_id` unless an add says otherwise). Never passed to llama_batch_free."""

    def __init__(self, capacity: int, n_embd: int = 0, seq_id: int = 0):
        self.capacity = int(capacity)
        self.seq_id = int(seq_id)
        self.n_embd = int(n_embd)
        self.tokens = np.zeros(self.capacity, dtype=np.int32)
        self.pos = np.zeros(self.capacity, dtype=np.int32)
        self.n_seq_id = np.ones(self.capacity, dtype=np.int32)
        self.seq_ids = np.zeros(self.capacity, dtype=np.int32)
        self.logits = np.zeros(self.capacity, dtype=np.int8)
        self.h = np.zeros((self.capacity, max(self.n_embd, 1)), dtype=np.float32)
        # token k's seq_id pointer is &seq_ids[k]: the pointers as one array of addresses (a list of
        # ctypes pointers took 3 ms per 512-token batch, and a batch is made per generation)
        self._seq_ptrs = self.seq_ids.ctypes.data + 4 * np.arange(self.capacity, dtype=np.uintp)
        self.n_tokens = 0
        self._llama_batch: Any = None  # built once: the numpy arrays never move

    def clear(self) -> None:
        self.n_tokens = 0

    def add_many(
        self,
        tokens: Any,
        pos0: int,
        *,
        seq_id: Optional[int] = None,
        logits_last: bool = False,
        h: Optional[np.ndarray] = None,
    ) -> int:
        """Append len(tokens) tokens at positions pos0, pos0+1, ... (vectorised); `h` is a
        (len(tokens), n_embd) block iff the batch carries h rows. Only the last appended token
        gets logits when logits_last. Returns the batch index of the last appended token."""
        n = len(tokens)
        k = self.n_tokens
        if n == 0:
            return k - 1
        if k + n > self.capacity:
            raise LlamaError(f"batch capacity {self.capacity} exceeded")
        self.tokens[k : k + n] = tokens
        self.pos[k : k + n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.seq_ids[k : k + n] = self.seq_id if seq_id is None else seq_id
        self.logits[k : k + n] = 0
        if logits_last:
            self.logits[k + n - 1] = 1
        if self.n_embd:
            if h is None:
                raise LlamaError("this batch carries h rows: pass h=")
            self.h[k : k + n] = h
        self.n_tokens = k + n
        return k + n - 1

    def add(
        self,
        token: int,
        pos: int,
        *,
        seq_id: Optional[int] = None,
        logits: bool = False,
        h: Optional[np.ndarray] = None,
    ) -> int:
        """Append one token; returns its batch index. `h` (length n_embd) is required iff the
        batch was created with n_embd > 0."""
        k = self.n_tokens
        if k >= self.capacity:
            raise LlamaError(f"batch capacity {self.capacity} exceeded")
        self.tokens[k] = token
        self.pos[k] = pos
        self.seq_ids[k] = self.seq_id if seq_id is None else seq_id
        self.logits[k] = 1 if logits else 0
        if self.n_embd:
            if h is None:
                raise LlamaError("this batch carries h rows: pass h=")
            self.h[k] = h
        self.n_tokens = k + 1
        return k

    def extend(self, other: Batch) -> int:
        """Append every row of another batch (its tokens, positions, sequences, output flags and h
        rows); returns the index of its first row here."""
        k, n = self.n_tokens, other.n_tokens
        if k + n > self.capacity:
            raise LlamaError(f"batch capacity {self.capacity} exceeded")
        pairs: tuple[tuple[np.ndarray, np.ndarray], ...] = (
            (self.tokens, other.tokens),
            (self.pos, other.pos),
            (self.seq_ids, other.seq_ids),
            (self.logits, other.logits),
        )
        for mine, theirs in pairs:
            mine[k : k + n] = theirs[:n]
        if self.n_embd:
            self.h[k : k + n] = other.h[:n]
        self.n_tokens = k + n
        return k

    def as_llama_batch(self) -> Any:
        b: Any = self._llama_batch
        if b is not None:
            b.n_tokens = self.n_tokens
            return b
        b = _C.llama_batch()
        b.n_tokens = self.n_tokens
        b.token = self.tokens.ctypes.data_as(ctypes.POINTER(_C.llama_token))
        b.embd = (
            self.h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if self.n_embd else ctypes.POINTER(ctypes.c_float)()
        )
        b.pos = self.pos.ctypes.data_as(ctypes.POINTER(_C.llama_pos))
        b.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = ctypes.cast(self._seq_ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(_C.llama_seq_id)))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._llama_batch = b
        return b


def decode(ctx: Context, batch: Batch) -> None:
    """llama_decode, waited for (llama_synchronize: a GPU backend returns before its work and the
    copies of its outputs are done, and the first read of the logits would wait instead, so a
    decode's time would be counted as the caller's); raises LlamaError on a non-zero return. A Ctrl-C
    that lands while ctypes reads the handle (Python code: `_as_parameter_`) stays a KeyboardInterrupt,
    not the ArgumentError ctypes wraps it in."""
    if batch.n_tokens == 0:
        return
    try:
        n_batch = int(_C.llama_n_batch(ctx))
        if batch.n_tokens > n_batch:  # llama.cpp would GGML_ASSERT (abort the process)
            raise LlamaError(f"batch of {batch.n_tokens} tokens exceeds the context's n_batch={n_batch}")
        rc = int(_C.llama_decode(ctx, batch.as_llama_batch()))
        if rc != 0:
            raise LlamaError(f"llama_decode failed with code {rc}")
        _C.llama_synchronize(ctx)
    except ctypes.ArgumentError as e:
        if "KeyboardInterrupt" in str(e):
            raise KeyboardInterrupt from None
        raise


def logits_ith(ctx: Context, i: int, *, copy: bool = True) -> np.ndarray:
    """Logits of batch index `i` (which must have been marked for output), shape (n_vocab,)."""
    ptr = _C.llama_get_logits_ith(ctx, int(i))
    if not ptr:
        raise LlamaError(f"no logits for batch index {i}")
    arr = np.ctypeslib.as_array(ptr, shape=(n_vocab(ctx.model),))
    return arr.copy() if copy else arr


def logits_rows(ctx: Context, n_rows: int, n_vocab_: int) -> np.ndarray:
    """A (n_rows, n_vocab) float32 VIEW of the last decode's logits, in output order (row i is
    batch index i when every batch token was marked for output). Valid until the next decode;
    cheaper than logits_ith when the caller already knows n_vocab."""
    address = logits_address(ctx)
    if not address:
        raise LlamaError("no logits (nothing decoded with output rows)")
    return float_view(address, int(n_rows) * int(n_vocab_)).reshape(int(n_rows), int(n_vocab_))


def embeddings_seq(ctx: Context, seq_id: int, n_embd: int) -> np.ndarray:
    """The pooled embedding of a sequence after a decode in a context made with `pooling` (a copy)."""
    ptr = _C.llama_get_embeddings_seq(ctx, int(seq_id))
    if not ptr:
        raise LlamaError(f"no pooled embedding for sequence {seq_id} (a context without pooling?)")
    return np.ctypeslib.as_array(ptr, shape=(int(n_embd),)).copy()


def memory_seq_rm(ctx: Context, seq_id: int, p0: int, p1: int = -1) -> bool:
    """Remove cells [p0, p1) of a sequence (p1=-1: to the end); False if llama.cpp refuses
    (a recurrent state that cannot roll back that far)."""
    return bool(_C.llama_memory_seq_rm(_C.llama_get_memory(ctx), int(seq_id), int(p0), int(p1)))


def memory_clear(ctx: Context, data: bool = True) -> None:
    """Drop every sequence (KV cells and recurrent states). Note: llama_memory_seq_rm with
    seq_id=-1 is refused by recurrent/hybrid memory (qwen35); use this or a concrete seq id.
    data=False only marks the cells free (no zeroing of the buffers: cheaper)."""
    _C.llama_memory_clear(_C.llama_get_memory(ctx), bool(data))


def memory_seq_clear(ctx: Context, seq_id: int, data: bool = True) -> None:
    """Drop one sequence: the whole memory where the context holds one (memory_clear), else that
    sequence's cells and state only."""
    if int(_C.llama_n_seq_max(ctx)) <= 1:
        memory_clear(ctx, data)
    elif not memory_seq_rm(ctx, seq_id, -1, -1):
        raise LlamaError(f"the context refused to drop sequence {seq_id}")


def memory_seq_copy(ctx: Context, src: int, dst: int) -> None:
    """Sequence `dst` made a copy of sequence `src` (what dst held dropped). Whole sequences only:
    across the streams of a split cache llama.cpp copies a stream's buffers (at the next decode),
    and a range would abort it."""
    mem = _C.llama_get_memory(ctx)
    _C.llama_memory_seq_rm(mem, int(dst), -1, -1)
    _C.llama_memory_seq_cp(mem, int(src), int(dst), -1, -1)


def memory_seq_span(ctx: Context, seq_id: int) -> tuple[int, int]:
    """(lowest, highest) position sequence `seq_id` holds in the context's memory; (-1, -1) for none."""
    mem = _C.llama_get_memory(ctx)
    return int(_C.llama_memory_seq_pos_min(mem, int(seq_id))), int(_C.llama_memory_seq_pos_max(mem, int(seq_id)))


def n_ctx_seq(ctx: Context) -> int:
    """Positions one sequence may hold (the context's size split per sequence, as llama.cpp does
    unless its KV cache is unified)."""
    return int(_C.llama_n_ctx_seq(ctx))


STATE_PARTIAL_ONLY: int = int(_C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)


class SeqCheckpoint:
    """A reusable buffer holding one sequence's state. With partial=True (the default) only the
    recurrent part of a hybrid memory is saved: the attention KV rolls back with memory_seq_rm."""

    def __init__(self, ctx: Context, seq_id: int = 0, *, partial: bool = True):
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

    def restore(self, ctx: Optional[Context] = None, seq_id: Optional[int] = None) -> None:
        """Put the saved state back (or into another context of the same model and layout, as `seq_id`)."""
        if self.n == 0:
            raise LlamaError("no checkpoint saved")
        ctx = self.ctx if ctx is None else ctx
        seq_id = self.seq_id if seq_id is None else int(seq_id)
        ptr = self.buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if int(_C.llama_state_seq_set_data_ext(ctx, ptr, self.n, seq_id, self.flags)) == 0:
            raise LlamaError("llama_state_seq_set_data_ext failed to restore the checkpoint")


def copy_seq_state(src: Context, src_seq: int, dst: Context, dst_seq: int) -> None:
    """What sequence src_seq holds in src's memory written into dst's as dst_seq (what dst_seq held
    dropped): one context, or two of one model with the same memory layout (sequence counts too)."""
    state = SeqCheckpoint(src, src_seq, partial=False)
    state.save()
    state.restore(dst, dst_seq)
