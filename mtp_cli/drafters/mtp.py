"""The model's own MTP head(s) (the target GGUF loaded with load_mtp, or an MTP sidecar `-md`) in an
LLAMA_CONTEXT_TYPE_MTP context paired with the target context.

Pairing (ARCHITECTURE §3): the MTP input at position p is token x_p with the target's h row of p-1. The
catch-up rows (accepted tokens with their target h rows) and the first draft row (id_last, pos,
h of pos-1) go in ONE decode with logits on the last row only; then one decode per further draft
token, each fed the head's own h row. Draft-paired rows are removed after verification
(memory_seq_rm) and re-fed with the target's h rows.

Chained heads (nextn_predict_layers > 1, e.g. step35): draft step i runs head i
(llama_set_nextn_layer_offset) over the whole draft prefix, as llama.cpp's
common_speculative_impl_draft_mtp does; memory-shared drafters (gemma4-assistant, ctx_other kept)
draft every token at pos with no KV of their own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional

import numpy as np

from gguf_tools.archs import NextnH, record
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.loadable.assistant import assistant_problem
from gguf_tools.names import ASSISTANT_ARCHS
from mtp_cli import llama_ext as lx
from mtp_cli.config import DRAFT_N_MAX_LIMIT, GenConfig
from mtp_cli.drafters.base import DRAFT_N_OUTPUTS, ContextPlan, Drafter, Loader, Models, check_same_vocab
from mtp_cli.errors import LlamaError, ModelFileError, NoMtpHeadError
from mtp_cli.sampling import ConfidenceProbe

# A memory-sharing drafter (gemma4-assistant) decodes one row at a time and never catches up: a
# one-row batch keeps its compute buffer small (the attention mask grows as n_ctx x n_batch: at
# n_ctx 131072 the tiny pair's is 256 MiB at n_batch 512, 0.5 MiB at 1).
SHARED_N_BATCH = 1
# The draft row's h after a merged decode (catch-up rows + the draft row, logits on the draft row):
# llama.cpp's masked h extraction copies the first n_outputs rows of the graph's h, so where the
# MTP graph takes h before selecting the output rows (glm4moe, qwen35, deepseek2, ...: ArchRecord
# nextn_h "all_rows") `_ith` of the draft row returned the FIRST catch-up row's h and drafts 2..
# were fed the wrong state. Those heads extract unmasked (every row, by batch index); graphs that
# select the rows first (step35, mimo2: "output_rows") stay masked (unmasked aborts there); for a
# graph the table does not describe every row of the merge is an output, right for both kinds, and
# a longer catch-up (a prompt) is decoded apart first so that at most MERGE_ROWS rows are outputs.
MERGE_ROWS = DRAFT_N_MAX_LIMIT + 1

_now = time.perf_counter


class MtpDrafter(Drafter):
    """The model's MTP head(s) in an MTP context paired with the target context."""

    name = "mtp"
    aliases = ("draft-mtp",)
    summary = "the model's MTP head, or an MTP sidecar (`draft_model`)"
    order = 1
    draft_file = "optional"
    drafts_with_model = True
    target_h = True
    can_sleep = True
    can_resume = True

    def __init__(
        self,
        head_model: lx.ModelPtr,
        target_ctx: lx.ContextPtr,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: Optional[int],
        n_vocab_target: int,
        p_min: float = 0.0,
        kv: Optional[lx.KvOptions] = None,
        nextn_h: NextnH = None,
    ):
        super().__init__()
        self.tgt = target_ctx
        self.ctx = lx.create_context(
            head_model,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            kv=kv,
            ctx_type=lx.CTX_TYPE_MTP,
            ctx_other=target_ctx,
            n_outputs_max=DRAFT_N_OUTPUTS if nextn_h else MERGE_ROWS,
            n_rs_seq=0,
        )
        lx.set_embeddings_nextn(target_ctx, True, False)  # target: an h row for every batch token
        # head: h rows for output rows only, or for every row where its graph keeps them all (MERGE_ROWS)
        lx.set_embeddings_nextn(self.ctx, True, nextn_h != "all_rows")
        self.all_outputs = nextn_h is None
        self.E = lx.n_embd_out(head_model)
        self.n_vocab = lx.n_vocab(head_model)
        self.n_vocab_target = int(n_vocab_target)
        other = lx.get_ctx_other(self.ctx)
        self.mem_shared = other is not None and lx.addr(other) == lx.addr(target_ctx)
        if lx.n_batch(self.ctx) < 2 and not self.mem_shared:  # (catch-up needs room for two rows)
            n = lx.n_batch(self.ctx)
            lx.free_context(self.ctx)
            raise LlamaError(
                f"the MTP context has a {n}-row batch and no share of the target's memory: it cannot catch up"
            )
        self.n_ctx = lx.n_ctx(self.ctx)
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

    # -- the spec ----------------------------------------------------------------------------------

    @classmethod
    def check_files(cls, target: GGUFFile, draft: Optional[GGUFFile]) -> None:
        if draft is None and target.layout().nextn_layers == 0:
            raise NoMtpHeadError(
                f"{target.path.name} has no MTP head (nextn_predict_layers = 0): graft one with `mtp-cli pack`, "
                "give an MTP sidecar as `draft_model`, or use `spec_type` ngram"
            )
        if draft is not None and draft.layout().nextn_layers == 0:
            raise NoMtpHeadError(
                f"`draft_model` {draft.path.name} has no MTP head (nextn_predict_layers = 0): for `spec_type` mtp "
                "it must be an MTP sidecar (`mtp-cli extract`); a plain small model drafts with `spec_type` draft"
            )
        if draft is not None and draft.arch in ASSISTANT_ARCHS:
            why = assistant_problem(target.scan, draft.scan)
            if why:
                raise ModelFileError(f"`draft_model` {draft.path.name} does not fit {target.path.name}: {why}")

    @classmethod
    def target_loads_head(cls, draft: Optional[GGUFFile]) -> bool:
        return draft is None

    @classmethod
    def load_draft(cls, models: Models, load: Loader) -> None:
        if models.draft_file is None:
            models.drafting = models.target  # its own head
            return
        dm = models.drafting = load(models.draft_file, "draft model", True)
        check_same_vocab(models.target, dm, models.target_file, models.draft_file)
        if lx.n_embd_out(dm) != lx.n_embd_out(models.target):
            raise ModelFileError(
                f"`draft_model` {models.draft_file.path.name}: MTP head width {lx.n_embd_out(dm)} "
                f"does not match the target's hidden size {lx.n_embd_out(models.target)}"
            )

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> MtpDrafter:
        shared = models.draft_file is not None and models.draft_file.arch in ASSISTANT_ARCHS
        return cls(
            models.drafting,
            plan.target,
            n_ctx=plan.n_ctx,
            n_batch=SHARED_N_BATCH if shared else plan.n_batch,
            n_threads=plan.n_threads,
            kv=plan.kv,
            n_vocab_target=lx.n_vocab(models.target),
            # (a shared one decodes one row at a time: as if the graph's h were the output rows')
            nextn_h="output_rows" if shared else head_nextn_h(models),
        )

    def configure(self, cfg: GenConfig) -> None:
        self.p_min = float(cfg.draft_p_min)

    # -- catch-up queue (the batch itself) -------------------------------------------------------

    def catch_up(self) -> None:
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
                self.catch_up()
                continue
            take = min(room, n - k)
            b.add_many(tokens[k : k + take], pos0 + k, h=h[k : k + take])
            k += take

    def begin(self, prompt: Sequence[int]) -> None:
        if self.chain:
            lx.set_nextn_layer_offset(self.ctx, 0)  # in case a previous generation was interrupted mid-chain
        if not self.mem_shared:
            lx.memory_clear(self.ctx)
        self.batch.clear()
        self.pending_h[:] = 0.0
        self._n_extra = 0

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool) -> None:
        """The last generation left the head's memory, its queued catch-up rows and pending_h (the
        target's h row of keep-1) exactly where the prompt's new tokens at keep.. continue them."""
        if self.chain:
            lx.set_nextn_layer_offset(self.ctx, 0)
        if asleep:
            self.restart(keep)  # (the target's last decode was one plain token at keep-1)

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

    def _pick(self, i: int) -> Optional[int]:
        """The draft token of output row i (None: below p_min)."""
        row = lx.logits_rows(self.ctx, i + 1, self.n_vocab)[i][: self.n_vocab_target]
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
        elif b.n_tokens >= (MERGE_ROWS if n_max > 0 and self.all_outputs else b.capacity):
            self.catch_up()
        if n_max <= 0:
            if not self.mem_shared:
                b.add(id_last, pos, h=self.pending_h)  # stays queued for the next catch-up
            return []
        # ONE decode: catch-up rows + the first draft row (id_last, pos, h of pos-1) (MERGE_ROWS)
        i_last = b.add(id_last, pos, logits=True, h=self.pending_h)
        if self.all_outputs:
            b.logits[: b.n_tokens] = 1
        self._decode(self.ctx, b)
        b.clear()
        out: list[int] = []
        i_out = i_last
        while True:
            tok = self._pick(i_out if self.all_outputs else 0)
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
        self.catch_up()
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
            if self.all_outputs:
                cb.logits[: cb.n_tokens] = 1  # (MERGE_ROWS)
            self._decode(self.ctx, cb)
            tok = self._pick(i_last if self.all_outputs else 0)
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
                raise LlamaError("MTP context refused to drop its draft rows")
            self._n_extra = 0
        h = lx.get_embeddings_nextn(self.tgt, n_accepted + 1, copy=False, n_embd=self.E)  # verify rows 0..a
        if n_accepted and not self.mem_shared:
            # d_i sits at pos+i and pairs with the target's h row of pos+i-1 = verify row i-1
            self._enqueue(list(drafts[:n_accepted]), pos + 1, h[:n_accepted])
        np.copyto(self.pending_h, h[n_accepted])

    def close(self) -> None:
        lx.free_context(self.ctx)
        self.ctx = None

    def cost_probe(self, n_rows: int) -> HeadProbe:
        """A probe that times this head's decodes of up to n_rows rows (the cost model's)."""
        return HeadProbe(self, n_rows)


def head_nextn_h(models: Models) -> NextnH:
    """How the drafting model's MTP graph hands out h (its arch's record; None: unknown)."""
    gf = models.draft_file or models.target_file
    rec = record(gf.arch)
    return rec.nextn_h if rec is not None else None


class HeadProbe:
    """Times the head's decodes as a step runs them, without advancing its memory: what the cost
    model (mtp_cli.speed.costs) measures. Call after begin/on_prefill/catch_up of a prompt."""

    def __init__(self, drafter: MtpDrafter, n_rows: int):
        self.d = drafter
        self.batch = lx.Batch(n_rows, drafter.E)
        self.shares_memory = drafter.mem_shared  # no catch-up rows: a step's first decode has one row

    def decode(self, tokens: Sequence[int], pos: int) -> float:
        """Seconds of one head decode of `tokens` at pos, pos+1, ... (all at pos when sharing the
        target's memory), each paired with the pending h row, the outputs a step's merged decode has."""
        b, d = self.batch, self.d
        b.clear()
        for j, tok in enumerate(tokens):
            last = j == len(tokens) - 1
            b.add(tok, pos if self.shares_memory else pos + j, logits=last or d.all_outputs, h=d.pending_h)
        t = _now()
        lx.decode(d.ctx, b)
        return _now() - t

    def reset(self, pos: int) -> None:
        """Drop the probe's rows from pos on."""
        if not self.shares_memory:
            lx.memory_seq_rm(self.d.ctx, 0, pos, -1)
