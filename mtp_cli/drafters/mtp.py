"""The model's own MTP head(s) (the target loaded with load_mtp, or an MTP sidecar `-md`) in an MTP
context paired with the target's. `MtpDrafter` is the spec (the registry's `mtp`) and what every
head shares; `create` picks one class per head kind (ARCHITECTURE §3):

    OwnKvHead        one head with its own KV: catch-up rows and the first draft row in ONE decode,
                     then one decode per draft token fed the head's own h; draft rows dropped after
                     verification, accepted ones re-fed with the target's h rows
    ChainedHeads     one head per draft step (step35, mimo2): head i over [id_last, d1..di]
    SharedAssistant  reads the target's own KV (gemma4-assistant): every draft row at pos
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from gguf_tools.archs import NextnH, nextn_h_of
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.names import ASSISTANT_ARCHS
from mtp_cli import llama_ext as lx
from mtp_cli.config import DRAFT_N_MAX_LIMIT, GenConfig
from mtp_cli.drafters.base import DRAFT_N_OUTPUTS, ContextPlan, Drafter, Drafting, HeadProbe, Loader, Models, Need
from mtp_cli.drafters.head_files import check_head_files, load_head
from mtp_cli.drafters.joint import alone
from mtp_cli.drafters.recall import Recall
from mtp_cli.drafters.rows import DraftRows
from mtp_cli.errors import LlamaError

# a shared assistant decodes row by row: its mask (n_ctx x n_batch) 0.5 MiB at 131072, not 256 MiB
SHARED_N_BATCH = 1
# The draft row's h after a merged decode: llama.cpp's masked extraction copies the first n_outputs
# rows of the graph's h, so where the graph takes h before selecting output rows (ArchRecord
# nextn_h "all_rows": glm4moe, qwen35, ...) `_ith` of the draft row gave the FIRST catch-up row's h.
# Those heads extract unmasked (by batch index); "output_rows" graphs (step35, mimo2) stay masked
# (unmasked aborts); for an unknown graph every merged row is an output (at most MERGE_ROWS).
MERGE_ROWS = DRAFT_N_MAX_LIMIT + 1


class MtpDrafter(Drafter):
    """The spec, and what every head kind shares: its context, the target's h row of the position
    before id_last (`pending_h`), the queue and the pick (DraftRows)."""

    name = "mtp"
    aliases = ("draft-mtp",)
    summary = "the model's MTP head, or an MTP sidecar (`draft_model`)"
    order = 1
    draft_file = "optional"
    drafts_with_model = True
    target_h = True
    can_sleep = True
    can_resume = True
    remembers = True
    rows: DraftRows
    mem_shared = False  # (SharedAssistant: it reads the target's KV)
    chain = False  # (ChainedHeads)

    def __init__(self, head_model: lx.Model, plan: ContextPlan, *, n_batch: int, n_vocab_target: int, nextn_h: NextnH):
        """A head context beside the plan's target context (n_batch: its own; plan.context), following plan.seq."""
        super().__init__()
        self.tgt = target_ctx = plan.target
        self.seq = plan.seq
        self.ctx = plan.context(
            (type(self).__name__, n_batch),
            lambda: lx.create_context(
                head_model,
                n_ctx=plan.n_ctx,
                n_batch=n_batch,
                n_threads=plan.n_threads,
                kv=plan.kv,
                ctx_type=lx.CTX_TYPE_MTP,
                ctx_other=target_ctx,
                n_outputs_max=(DRAFT_N_OUTPUTS if nextn_h else MERGE_ROWS) * plan.n_seq,  # (every slot's: joint)
                n_rs_seq=0,
                n_seq_max=plan.n_seq,
            ),
        )
        self._owns = plan.shared is None  # (else the plan's holder closes it)
        lx.set_embeddings_nextn(target_ctx, True, False)  # target: an h row for every batch token
        # head: h rows for output rows only, or for every row where its graph keeps them all (MERGE_ROWS)
        lx.set_embeddings_nextn(self.ctx, True, nextn_h != "all_rows")
        self.all_outputs = nextn_h is None
        self.E = lx.n_embd_out(head_model)
        self.n_ctx = lx.n_ctx_seq(self.ctx)
        self.n_heads = max(1, lx.n_layer_nextn(head_model))
        self.rows = DraftRows(self.ctx, lx.n_vocab(head_model), n_vocab_target, self.catch_up, self.E, self.seq)
        self.pending_h = np.zeros(self.E, dtype=np.float32)  # target h row of the position before id_last
        self.recall = Recall(self.E)  # the prompt's last rows, re-read on waking
        try:
            self._check_context()
        except LlamaError:
            if self._owns:
                self.ctx.close()
            raise

    def _check_context(self) -> None:
        if self._shares_target() or lx.n_batch(self.ctx) < 2:  # (catch-up needs room for two rows)
            raise LlamaError(f"an MTP context of {lx.n_batch(self.ctx)}-row batches reading the target's memory")

    def _target_h(self, n: int) -> np.ndarray:
        """The h rows of this sequence's first n rows in the target's last decode (a view)."""
        return lx.get_embeddings_nextn(self.tgt, self.h0 + n, copy=False, n_embd=self.E)[self.h0 :]

    def _shares_target(self) -> bool:
        return lx.reads_memory_of(self.ctx, self.tgt)

    # -- the spec ----------------------------------------------------------------------------------

    @classmethod
    def check_files(cls, target: GGUFFile, draft: Optional[GGUFFile]) -> None:
        check_head_files(target, draft)

    @classmethod
    def target_loads_head(cls, draft: Optional[GGUFFile]) -> bool:
        return draft is None

    @classmethod
    def load_draft(cls, models: Models, load: Loader) -> None:
        load_head(models, load)

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> MtpDrafter:
        """The drafter of this head's kind."""
        shared = models.draft_file is not None and models.draft_file.arch in ASSISTANT_ARCHS
        head = models.drafter_model()
        kind: type[MtpDrafter] = (
            SharedAssistant if shared else ChainedHeads if lx.n_layer_nextn(head) > 1 else OwnKvHead
        )
        return kind(
            head,
            plan,
            n_batch=SHARED_N_BATCH if shared else plan.n_batch,
            n_vocab_target=lx.n_vocab(models.target),
            # (a shared one decodes one row at a time: as if the graph's h were the output rows')
            nextn_h="output_rows" if shared else nextn_h_of((models.draft_file or models.target_file).arch),
        )

    def configure(self, cfg: GenConfig) -> None:
        self.rows.p_min = float(cfg.draft_p_min)

    # -- the protocol: the shared steps; each kind adds its own ---------------------------------------

    def catch_up(self) -> None:
        """Decode the queued catch-up rows (no logits)."""
        if self.rows.batch.n_tokens:
            self._decode(self.ctx, self.rows.batch)
            self.rows.batch.clear()

    def begin(self, prompt: Sequence[int]) -> None:
        lx.memory_seq_clear(self.ctx, self.seq)
        self.rows.batch.clear()
        self.pending_h[:] = 0.0
        self.rows.n_extra = 0
        self.recall.clear()

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool, rewound: bool) -> None:
        """The head's memory, queued rows and pending_h continue where the prompt's tokens at keep.. do."""
        self.recall.cut(keep)
        if asleep:  # (its memory has a gap: over at keep, as after a sleep; the target's last decode had no h)
            self.restart(keep, h=False)
        elif rewound:
            self._rewind(keep)

    def adopt(self, lender: Optional[Drafter], prompt: Sequence[int], keep: int) -> None:
        """Warm where it can: the lender head's memory, queued rows below keep and the target's h row of
        keep-1 where it has it (DraftRows.lend); else cold, as after a sleep."""
        self.recall.clear()  # (its rows were another text's)
        if isinstance(lender, MtpDrafter) and not self.mem_shared:
            if lender.rows.lend(self.rows, keep, lender.pending_h, self.pending_h):
                return
        self.resume(prompt, keep, True, True)

    def _rewind(self, keep: int) -> None:
        """Drop what the head holds from keep on; its row at keep pairs with no h (the target's row of
        keep-1 went with an earlier batch)."""
        self.catch_up()
        if not lx.memory_seq_rm(self.ctx, self.seq, keep, -1):
            raise LlamaError("MTP context refused to drop its rows past the kept prompt")
        self.rows.n_extra = 0
        self.pending_h[:] = 0.0

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        n = len(tokens)
        h = self._target_h(n)
        # position pos0+k pairs with h row pos0+k-1: pending_h, then this chunk's rows 0..n-2
        self.rows.enqueue(tokens[:1], pos0, self.pending_h[None, :], spare=1)
        if n > 1:
            self.rows.enqueue(tokens[1:], pos0 + 1, h[: n - 1], spare=1)
        np.copyto(self.pending_h, h[n - 1])
        self.recall.add(tokens, h, pos0)

    def remember(self, tokens: np.ndarray, pos0: int) -> None:
        """Keep a prompt chunk's rows for waking; asleep, the head decodes none, and its pending h row
        stays that of what it holds (a slot borrowing its rows takes it: DraftRows.lend)."""
        self.recall.add(tokens, self._target_h(len(tokens)), pos0)

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        return alone(self.drafting(id_last, pos, n_max))

    def drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        self.rows.pos, self.rows.n_extra = pos, 0
        return (yield from self._drafting(id_last, pos, n_max))

    def _drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:  # (each kind's own)
        raise NotImplementedError

    def restart(self, pos: int, h: bool = True, row: int = 0) -> None:
        """Resume after skipped steps: the head's memory starts over at `pos`, the prompt's last rows
        below it (Recall), its first draft row paired with the target's h row of pos-1 (row `row` of
        its last decode, which a lookup may have drafted), or none."""
        lx.memory_seq_clear(self.ctx, self.seq, data=False)
        self.rows.batch.clear()
        self.rows.n_extra = 0
        toks, hs = self.recall.below(pos)  # (the prompt's last rows, just below pos: Recall)
        if len(toks):
            self.rows.enqueue(toks, pos - len(toks), hs, spare=1)
        self._last_h(h, row)

    def _last_h(self, h: bool, row: int = 0) -> None:
        """pending_h: h row `row` of the target's last decode, or zeros when it computed none."""
        if h:
            np.copyto(self.pending_h, self._target_h(row + 1)[row])
        else:
            self.pending_h[:] = 0.0

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        h = self._target_h(n_accepted + 1)  # verify rows 0..a
        self._keep(n_accepted, drafts, h)
        np.copyto(self.pending_h, h[n_accepted])

    def _keep(self, n_accepted: int, drafts: Sequence[int], h: np.ndarray) -> None:
        """Drop the draft-paired rows; queue the accepted drafts with the target's h rows."""
        pos = self.rows.pos
        if self.rows.n_extra:
            if not lx.memory_seq_rm(self.ctx, self.seq, pos + 1, -1):
                raise LlamaError("MTP context refused to drop its draft rows")
            self.rows.n_extra = 0
        if n_accepted:
            # d_i sits at pos+i and pairs with the target's h row of pos+i-1 = verify row i-1
            self.rows.enqueue(list(drafts[:n_accepted]), pos + 1, h[:n_accepted], spare=1)

    def close(self) -> None:
        if self._owns:
            self.ctx.close()

    def cost_probe(self, n_rows: int) -> HeadProbe:
        """A probe that times this head's decodes of up to n_rows rows (the cost model's)."""
        return HeadProbe(self.ctx, self.E, self.pending_h, self.all_outputs, self.mem_shared, n_rows, self.seq)


class OwnKvHead(MtpDrafter):
    """One head with its own KV: the merged decode, then one decode per further draft token, each
    shareable with other sequences' heads in the same context (drafters.joint)."""

    def _drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        rows, b = self.rows, self.rows.batch
        if b.n_tokens >= (MERGE_ROWS if n_max > 0 and self.all_outputs else b.capacity):
            self.catch_up()
        if n_max <= 0:
            b.add(id_last, pos, h=self.pending_h)  # stays queued for the next catch-up
            return []
        # ONE decode: catch-up rows + the first draft row (id_last, pos, h of pos-1) (MERGE_ROWS)
        i_out = b.add(id_last, pos, logits=True, h=self.pending_h)
        if self.all_outputs:
            b.logits[: b.n_tokens] = 1
        out: list[int] = []
        while True:
            at = yield Need(self, self.ctx, b)
            b.clear()
            tok = rows.pick(at.out0 + (i_out if self.all_outputs else 0))
            if tok is None:
                break
            out.append(tok)
            if len(out) >= n_max:
                break
            h = lx.get_embeddings_nextn_ith(self.ctx, at.row0 + i_out, copy=False, n_embd=self.E)
            i_out = b.add(tok, pos + len(out), logits=True, h=h)
            rows.n_extra += 1
        return out


class ChainedHeads(MtpDrafter):
    """n heads, one per draft step: every head catches up over the same rows, and draft step i runs
    head i over [id_last, d1..di] (common_speculative_impl_draft_mtp with chain_heads)."""

    chain = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.n_max_limit = self.n_heads
        self.chain_h = np.zeros((self.n_heads + 1, self.E), dtype=np.float32)
        self.chain_batch = lx.Batch(self.n_heads + 1, self.E, self.seq)

    def catch_up(self) -> None:
        alone(self._catching_up())

    def _catching_up(self) -> Drafting:
        """Every head over the queued rows, a decode each (shareable: drafters.joint)."""
        b = self.rows.batch
        if b.n_tokens:
            first = int(b.pos[0])
            for head in range(self.n_heads):  # (KV cells are shared: each head re-decodes its own)
                lx.memory_seq_rm(self.ctx, self.seq, first, -1)
                # (an unknown graph's h is extracted by output: these rows have none, so alone)
                yield Need(self, self.ctx, b, layer=head, alone=self.all_outputs)
            lx.set_nextn_layer_offset(self.ctx, 0)
            b.clear()
        return []

    def begin(self, prompt: Sequence[int]) -> None:
        lx.set_nextn_layer_offset(self.ctx, 0)  # in case a previous generation was interrupted mid-chain
        super().begin(prompt)

    def restart(self, pos: int, h: bool = True, row: int = 0) -> None:
        lx.set_nextn_layer_offset(self.ctx, 0)
        super().restart(pos, h, row)

    def _drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        yield from self._catching_up()
        if n_max <= 0:
            self.rows.batch.add(id_last, pos, h=self.pending_h)
            return []
        cb = self.chain_batch
        self.chain_h[0] = self.pending_h
        out: list[int] = []
        for i in range(min(n_max, self.n_heads)):
            lx.memory_seq_rm(self.ctx, self.seq, pos, -1)
            cb.clear()
            toks = [id_last] + out
            i_last = cb.add_many(toks, pos, logits_last=True, h=self.chain_h[: len(toks)])
            if self.all_outputs:
                cb.logits[: cb.n_tokens] = 1  # (MERGE_ROWS)
            at = yield Need(self, self.ctx, cb, layer=i)  # (head i: every slot's step i in one decode)
            tok = self.rows.pick(at.out0 + (i_last if self.all_outputs else 0))
            if tok is None:
                break
            out.append(tok)
            h = lx.get_embeddings_nextn_ith(self.ctx, at.row0 + i_last, copy=False, n_embd=self.E)
            np.copyto(self.chain_h[len(out)], h)
        lx.set_nextn_layer_offset(self.ctx, 0)
        # every head's layer now holds rows at pos..: drop them, the catch-up re-feeds id_last
        lx.memory_seq_rm(self.ctx, self.seq, pos, -1)
        self.rows.batch.add(id_last, pos, h=self.pending_h)
        return out


class SharedAssistant(MtpDrafter):
    """A drafter that reads the target's own KV (ctx_other kept): no memory of its own to clear,
    catch up or roll back; every draft row sits at pos, fed the assistant's own state."""

    mem_shared = True
    remembers = False  # (no memory of its own to refill)

    def _check_context(self) -> None:
        if not self._shares_target():
            raise LlamaError("llama.cpp did not give this assistant the target's memory (ctx_other)")

    def catch_up(self) -> None:
        self.rows.batch.clear()  # (shares the target's KV: nothing to catch up)

    def begin(self, prompt: Sequence[int]) -> None:
        self.rows.batch.clear()
        self.pending_h[:] = 0.0

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        np.copyto(self.pending_h, self._target_h(len(tokens))[-1])

    def restart(self, pos: int, h: bool = True, row: int = 0) -> None:
        self.rows.batch.clear()
        self._last_h(h, row)

    def _keep(self, n_accepted: int, drafts: Sequence[int], h: np.ndarray) -> None:
        """Nothing: its memory is the target's, which the loop rolled back."""

    def _rewind(self, keep: int) -> None:
        self.rows.batch.clear()  # (its memory is the target's, which the loop rewound)
        self.pending_h[:] = 0.0

    def _drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        b, tok, h = self.rows.batch, id_last, self.pending_h
        out: list[int] = []
        while len(out) < n_max:
            b.clear()
            b.add(tok, pos, logits=True, h=h)
            at = yield Need(self, self.ctx, b)
            nxt = self.rows.pick(at.out0)
            if nxt is None:
                break
            out.append(nxt)
            tok, h = nxt, lx.get_embeddings_nextn_ith(self.ctx, at.row0, copy=False, n_embd=self.E)
        b.clear()
        return out
