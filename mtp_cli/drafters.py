"""Drafters: where the draft tokens of one speculative step come from.

One small interface (`Drafter`), driven by the verify loop in runtime.py:

    begin(prompt)                     a new generation: reset state, clear own context(s)
    on_prefill(tokens, pos0)          the target just decoded a prompt chunk at pos0..
    draft(id_last, pos, n_max)        up to n_max tokens to follow id_last (which sits at `pos`
                                      and is not yet in the target's memory); n_max may be 0
    accept(n_accepted, drafts)        the target kept drafts[:n_accepted] (+ its own token,
                                      which comes back as the next id_last); roll back the rest
    restart(pos)                      (drafters with can_sleep) resume after the runtime skipped
                                      draft()/accept() for some steps (drafting switched off by an
                                      adaptive controller); the target holds 0..pos-1 and its last
                                      decode was one plain token at pos-1

Positions: the target holds 0..pos-1 when draft() is called; id_last is at pos, draft i (0-based)
at pos+1+i.

Implementations:

- NoDrafter:      never drafts (plain decoding through the same loop).
- NgramDrafter:   prompt lookup: the longest recent n-gram (ngram_max..ngram_min tokens, ending with
                  id_last) that occurred before in prompt+generated text proposes what followed it.
- ModelDrafter:   a separate small GGUF with the same vocabulary, its own context, greedy drafting.
                  Rollback drops KV cells; a draft model with recurrent state (hybrid/recurrent
                  archs) is checkpointed (llama_state_seq_*, recurrent part only) after its catch-up
                  decode and restored when a decoded draft token was rejected.
- MtpDrafter:     the model's own MTP head (same GGUF loaded with load_mtp, or an MTP sidecar) in an
                  LLAMA_CONTEXT_TYPE_MTP context. Pairing (DESIGN 3): the MTP input at position p is
                  token x_p with the target's h row of p-1. The catch-up rows (accepted tokens with
                  their target h rows) and the first draft row (id_last, pos, h of pos-1) go in ONE
                  decode with logits on the last row only; then one decode per further draft token,
                  each fed the head's own h row. Draft-paired rows are removed after verification
                  (memory_seq_rm) and re-fed with the target's h rows.
                  Chained heads (nextn_predict_layers > 1, e.g. step35): draft step i runs head i
                  (llama_set_nextn_layer_offset) over the whole draft prefix, as llama.cpp's
                  common_speculative_impl_draft_mtp does; memory-shared drafters (gemma4-assistant,
                  ctx_other kept) draft every token at pos with no KV of their own.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.sampling import ConfidenceProbe

_now = time.perf_counter


class Drafter:
    """Base: never drafts. Subclasses override what they need."""

    name = "none"
    #: a hard cap on the draft length from the drafter itself (chained heads: one per head)
    n_max_limit: Optional[int] = None
    #: True if steps may be skipped (restart() resumes): MTP heads, whose input is mostly the
    #: target's h row; not n-gram or draft-model drafters, which need every token of the history
    can_sleep: bool = False

    def __init__(self) -> None:
        self.t_decode = 0.0  # seconds inside llama_decode (draft context)
        self.n_decode = 0  # llama_decode calls on the draft context

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        pass

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        return []

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        pass

    def restart(self, pos: int) -> None:
        pass

    def close(self) -> None:
        pass

    def _decode(self, ctx: lx.ContextPtr, batch: lx.Batch) -> None:
        t = _now()
        lx.decode(ctx, batch)
        self.t_decode += _now() - t
        self.n_decode += 1


class NoDrafter(Drafter):
    name = "none"


class NgramDrafter(Drafter):
    """Prompt-lookup drafting over prompt + generated tokens, O(1) per step: an index maps each
    n-gram (n in ngram_min..ngram_max) to where its most recent earlier occurrence continued."""

    name = "ngram"

    def __init__(self, ngram_min: int = 2, ngram_max: int = 4):
        super().__init__()
        self.ngram_min = int(ngram_min)
        self.ngram_max = int(ngram_max)
        self.hist: list[int] = []
        self.index: dict[int, dict[tuple[int, ...], int]] = {}

    def begin(self, prompt: Sequence[int]) -> None:
        self.hist = []
        self.index = {n: {} for n in range(self.ngram_min, self.ngram_max + 1)}
        for t in prompt:
            self._push(int(t))

    def _push(self, tok: int) -> None:
        h = self.hist
        j = len(h)  # index of the new token: register the n-grams that end right before it
        h.append(tok)
        for n, idx in self.index.items():
            if j >= n:
                idx[tuple(h[j - n:j])] = j

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        self._push(int(id_last))  # id_last is final: it is part of the history from now on
        if n_max <= 0:
            return []
        h = self.hist
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(h) <= n:
                continue
            start = self.index[n].get(tuple(h[-n:]))
            if start is None:
                continue
            out: list[int] = []
            L = len(h)
            for k in range(n_max):  # copy what followed, overlapping into the draft itself (LZ77-style)
                i = start + k
                out.append(h[i] if i < L else out[i - L])
            return out
        return []

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        for t in drafts[:n_accepted]:
            self._push(int(t))


class ModelDrafter(Drafter):
    """A separate draft model (same vocabulary), greedy, in its own context."""

    name = "draft"

    def __init__(self, model: lx.ModelPtr, *, n_ctx: int, n_batch: int, n_threads: Optional[int],
                 n_vocab_target: int, p_min: float = 0.0):
        super().__init__()
        self.model = model
        self.ctx = lx.create_context(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        self.n_vocab = lx.n_vocab(model)
        self.n_vocab_target = int(n_vocab_target)
        self.recurrent = lx.model_has_recurrent_state(model)
        self.ckpt = lx.SeqCheckpoint(self.ctx) if self.recurrent else None
        self.batch = lx.Batch(lx.n_batch(self.ctx))
        self.p_min = float(p_min)
        self.probe = ConfidenceProbe(self.n_vocab)
        self._pos = 0  # position of the last id_last given to draft()
        self._n_extra = 0  # draft tokens decoded beyond pos (to roll back or keep)

    def begin(self, prompt: Sequence[int]) -> None:
        lx.memory_clear(self.ctx)
        self.batch.clear()
        self._n_extra = 0

    def _enqueue(self, tokens: Sequence[int] | np.ndarray, pos0: int) -> None:
        b = self.batch
        n = len(tokens)
        k = 0
        while k < n:
            room = b.capacity - b.n_tokens
            if room == 0:
                self._decode(self.ctx, b)
                b.clear()
                continue
            take = min(room, n - k)
            b.add_many(tokens[k:k + take], pos0 + k)
            k += take

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        self._enqueue(tokens, pos0)

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        self._pos = pos
        self._n_extra = 0
        b = self.batch
        if b.n_tokens == b.capacity:
            self._decode(self.ctx, b)
            b.clear()
        b.add(id_last, pos, logits=n_max > 0)
        if n_max <= 0:
            return []  # the row stays queued for the next catch-up
        self._decode(self.ctx, b)
        b.clear()
        if self.ckpt is not None:
            self.ckpt.save()  # state after id_last: where a rejected draft rolls back to
        out: list[int] = []
        V = self.n_vocab_target
        while True:
            row = lx.logits_rows(self.ctx, 1, self.n_vocab)[0][:V]
            tok = int(row.argmax())
            if self.p_min > 0.0 and self.probe.top_prob(row) < self.p_min:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            b.add(tok, pos + len(out), logits=True)
            self._decode(self.ctx, b)
            b.clear()
            self._n_extra += 1
        return out

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        pos, extra = self._pos, self._n_extra
        keep = min(n_accepted, extra)  # accepted draft tokens already decoded at pos+1..pos+keep
        if extra > keep:
            if self.ckpt is not None:
                self.ckpt.restore()
                keep = 0
            if not lx.memory_seq_rm(self.ctx, 0, pos + 1 + keep, -1):
                raise lx.LlamaError(f"draft context refused to roll back to position {pos + keep}")
        self._n_extra = 0
        if n_accepted > keep:
            self._enqueue(list(drafts[keep:n_accepted]), pos + 1 + keep)

    def close(self) -> None:
        lx.free_context(self.ctx)
        self.ctx = None


class MtpDrafter(Drafter):
    """The model's MTP head(s) in an MTP context paired with the target context."""

    name = "mtp"
    can_sleep = True

    def __init__(self, head_model: lx.ModelPtr, target_ctx: lx.ContextPtr, *, n_ctx: int, n_batch: int,
                 n_threads: Optional[int], n_vocab_target: int, p_min: float = 0.0):
        super().__init__()
        self.tgt = target_ctx
        self.ctx = lx.create_context(head_model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                     ctx_type=lx.CTX_TYPE_MTP, ctx_other=target_ctx, n_rs_seq=0)
        lx.set_embeddings_nextn(target_ctx, True, False)  # target: an h row for every batch token
        lx.set_embeddings_nextn(self.ctx, True, True)  # head: h rows for output rows only
        self.E = lx.n_embd_out(head_model)
        self.n_vocab = lx.n_vocab(head_model)
        self.n_vocab_target = int(n_vocab_target)
        other = lx.get_ctx_other(self.ctx)
        self.mem_shared = other is not None and lx._addr(other) == lx._addr(target_ctx)
        self.n_heads = max(1, lx.n_layer_nextn(head_model))
        self.chain = self.n_heads > 1 and not self.mem_shared
        self.n_max_limit = self.n_heads if self.chain else None
        self.batch = lx.Batch(lx.n_batch(self.ctx), self.E)
        self.pending_h = np.zeros(self.E, dtype=np.float32)  # target h row of the position before id_last
        self.p_min = float(p_min)
        self.probe = ConfidenceProbe(self.n_vocab)
        self._pos = 0
        self._n_extra = 0  # positions > pos holding draft-paired rows
        if self.chain:
            self.chain_h = np.zeros((self.n_heads + 1, self.E), dtype=np.float32)
            self.chain_batch = lx.Batch(self.n_heads + 1, self.E)

    # -- catch-up queue (the batch itself) -------------------------------------------------------

    def _flush(self) -> None:
        """Decode the queued catch-up rows (no logits). Chained heads: once per head."""
        b = self.batch
        if b.n_tokens == 0:
            return
        if self.mem_shared:  # shares the target's KV: nothing to catch up
            b.clear()
            return
        if self.chain:
            first = int(b.pos[0])
            for head in range(self.n_heads):
                lx.memory_seq_rm(self.ctx, 0, first, -1)
                lx.set_nextn_layer_offset(self.ctx, head)
                self._decode(self.ctx, b)
            lx.set_nextn_layer_offset(self.ctx, 0)
        else:
            self._decode(self.ctx, b)
        b.clear()

    def _enqueue(self, tokens: Sequence[int] | np.ndarray, pos0: int, h: np.ndarray) -> None:
        b = self.batch
        n = len(tokens)
        k = 0
        while k < n:
            room = b.capacity - b.n_tokens - 1  # keep one slot for the draft row
            if room <= 0:
                self._flush()
                continue
            take = min(room, n - k)
            b.add_many(tokens[k:k + take], pos0 + k, h=h[k:k + take])
            k += take

    def begin(self, prompt: Sequence[int]) -> None:
        if self.chain:
            lx.set_nextn_layer_offset(self.ctx, 0)  # in case a previous generation was interrupted mid-chain
        if not self.mem_shared:
            lx.memory_clear(self.ctx)
        self.batch.clear()
        self.pending_h[:] = 0.0
        self._n_extra = 0

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        n = len(tokens)
        h = lx.get_embeddings_nextn(self.tgt, n, copy=False, n_embd=self.E)
        if not self.mem_shared:
            # position pos0+k pairs with h row pos0+k-1: pending_h, then this chunk's rows 0..n-2
            self._enqueue(tokens[:1], pos0, self.pending_h[None, :])
            if n > 1:
                self._enqueue(tokens[1:], pos0 + 1, h[: n - 1])
        np.copyto(self.pending_h, h[n - 1])

    # -- drafting -----------------------------------------------------------------------------------

    def _pick(self) -> Optional[int]:
        row = lx.logits_rows(self.ctx, 1, self.n_vocab)[0][: self.n_vocab_target]  # the one output row
        tok = int(row.argmax())
        if self.p_min > 0.0 and self.probe.top_prob(row) < self.p_min:
            return None
        return tok

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        self._pos = pos
        self._n_extra = 0
        if self.chain:
            return self._draft_chain(id_last, pos, n_max)
        b = self.batch
        if self.mem_shared:
            b.clear()
        elif b.n_tokens == b.capacity:
            self._flush()
        if n_max <= 0:
            if not self.mem_shared:
                b.add(id_last, pos, h=self.pending_h)  # stays queued for the next catch-up
            return []
        # ONE decode: catch-up rows + the first draft row (id_last, pos, h of pos-1), logits on it
        i_last = b.add(id_last, pos, logits=True, h=self.pending_h)
        self._decode(self.ctx, b)
        b.clear()
        out: list[int] = []
        i_out = i_last
        while True:
            tok = self._pick()
            if tok is None:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            h = lx.get_embeddings_nextn_ith(self.ctx, i_out, copy=False, n_embd=self.E)
            # memory-shared drafters (gemma4-assistant) keep every draft row at pos
            b.add(tok, pos if self.mem_shared else pos + len(out), logits=True, h=h)
            self._decode(self.ctx, b)
            b.clear()
            i_out = 0
            if not self.mem_shared:
                self._n_extra += 1
        return out

    def _draft_chain(self, id_last: int, pos: int, n_max: int) -> list[int]:
        """Chained heads: catch up every head, then draft step i runs head i over [id_last, d1..di]
        (common_speculative_impl_draft_mtp with chain_heads)."""
        self._flush()
        if n_max <= 0:
            self.batch.add(id_last, pos, h=self.pending_h)
            return []
        cb = self.chain_batch
        self.chain_h[0] = self.pending_h
        out: list[int] = []
        for i in range(min(n_max, self.n_heads)):
            lx.memory_seq_rm(self.ctx, 0, pos, -1)
            lx.set_nextn_layer_offset(self.ctx, i)
            cb.clear()
            toks = [id_last] + out
            i_last = cb.add_many(toks, pos, logits_last=True, h=self.chain_h[: len(toks)])
            self._decode(self.ctx, cb)
            tok = self._pick()
            if tok is None:
                break
            out.append(tok)
            np.copyto(self.chain_h[len(out)], lx.get_embeddings_nextn_ith(self.ctx, i_last, copy=False, n_embd=self.E))
        lx.set_nextn_layer_offset(self.ctx, 0)
        # every head's layer now holds rows at pos..: drop them, the catch-up re-feeds id_last
        lx.memory_seq_rm(self.ctx, 0, pos, -1)
        self.batch.add(id_last, pos, h=self.pending_h)
        return out

    def restart(self, pos: int) -> None:
        """Resume cold after skipped steps: the head's own memory starts over at `pos` (no history
        before it: the head then drafts from the target's h rows and what it sees from now on);
        the first draft row pairs with the target's h row of pos-1 (its last, one-token decode)."""
        if self.chain:
            lx.set_nextn_layer_offset(self.ctx, 0)
        if not self.mem_shared:
            lx.memory_clear(self.ctx, data=False)
        self.batch.clear()
        self._n_extra = 0
        np.copyto(self.pending_h, lx.get_embeddings_nextn(self.tgt, 1, copy=False, n_embd=self.E)[0])

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        pos = self._pos
        if self._n_extra:
            if not lx.memory_seq_rm(self.ctx, 0, pos + 1, -1):
                raise lx.LlamaError("MTP context refused to drop its draft rows")
            self._n_extra = 0
        h = lx.get_embeddings_nextn(self.tgt, n_accepted + 1, copy=False, n_embd=self.E)  # verify rows 0..a
        if n_accepted and not self.mem_shared:
            # d_i sits at pos+i and pairs with the target's h row of pos+i-1 = verify row i-1
            self._enqueue(list(drafts[:n_accepted]), pos + 1, h[:n_accepted])
        np.copyto(self.pending_h, h[n_accepted])

    def close(self) -> None:
        lx.free_context(self.ctx)
        self.ctx = None


__all__ = ["Drafter", "NoDrafter", "NgramDrafter", "ModelDrafter", "MtpDrafter"]
