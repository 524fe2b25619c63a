"""A separate draft model with the target's vocabulary (`-md`), greedy, in its own context.

Rollback drops KV cells; a draft model with recurrent state (hybrid/recurrent archs) is
checkpointed (llama_state_seq_*, recurrent part only) after its catch-up decode and restored when
a decoded draft token was rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from gguf_tools.gguf_file import GGUFFile
from gguf_tools.names import ASSISTANT_ARCHS
from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import (
    DRAFT_N_OUTPUTS,
    ContextPlan,
    Drafter,
    Drafting,
    Loader,
    Models,
    Need,
    check_same_vocab,
)
from mtp_cli.drafters.joint import alone
from mtp_cli.drafters.rows import DraftRows
from mtp_cli.errors import ConfigError, ModelFileError


class ModelDrafter(Drafter):
    """A separate draft model (same vocabulary), greedy, in its own context."""

    rows: DraftRows

    name = "draft"
    aliases = ("draft-simple",)
    summary = "a small draft model with the same vocabulary (`draft_model`)"
    order = 2
    draft_file = "required"
    drafts_with_model = True

    def __init__(self, model: lx.Model, plan: ContextPlan, *, n_vocab_target: int, p_min: float = 0.0):
        """A context of its own beside the plan's target (one for every sequence: plan.context), following plan.seq."""
        super().__init__()
        seq = plan.seq
        self.model, self.seq = model, seq
        self.ctx = plan.context(
            ("ModelDrafter", plan.n_batch),
            lambda: lx.create_context(
                model,
                n_ctx=plan.n_ctx,
                n_batch=plan.n_batch,
                n_threads=plan.n_threads,
                kv=plan.kv,
                n_outputs_max=DRAFT_N_OUTPUTS * plan.n_seq,  # (every slot's: drafters.joint)
                n_seq_max=plan.n_seq,
            ),
        )
        self._owns = plan.shared is None  # (else the plan's holder closes it)
        self.recurrent = lx.model_has_recurrent_state(model)
        self.ckpt = lx.SeqCheckpoint(self.ctx, seq) if self.recurrent else None
        self.rows = DraftRows(self.ctx, lx.n_vocab(model), n_vocab_target, self._flush, seq=seq)
        self.rows.p_min = float(p_min)
        self.n_ctx = lx.n_ctx_seq(self.ctx)

    @classmethod
    def check_files(cls, target: GGUFFile, draft: Optional[GGUFFile]) -> None:
        if draft is None:
            raise ConfigError("spec type draft needs a draft model (`draft_model`)")
        if draft.is_mtp_sidecar:
            raise ModelFileError(f"`draft_model` {draft.path.name} is an MTP-only sidecar: use it with `spec_type` mtp")
        if draft.arch in ASSISTANT_ARCHS:  # (llama.cpp asserts: the assistant's graph needs the target's context)
            raise ModelFileError(
                f"`draft_model` {draft.path.name} is a {draft.arch} drafter, which reads the target's memory: "
                "use it with `spec_type` mtp (llama.cpp's draft-mtp)"
            )

    @classmethod
    def load_draft(cls, models: Models, load: Loader) -> None:
        assert models.draft_file is not None  # check_files refused otherwise
        models.drafting = load(models.draft_file, "draft model", False)
        check_same_vocab(models.target, models.drafting, models.target_file, models.draft_file)

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> ModelDrafter:
        return cls(models.drafter_model(), plan, n_vocab_target=lx.n_vocab(models.target))

    def configure(self, cfg: GenConfig) -> None:
        self.rows.p_min = float(cfg.draft_p_min)

    def begin(self, prompt: Sequence[int]) -> None:
        lx.memory_seq_clear(self.ctx, self.seq)
        self.rows.batch.clear()
        self.rows.n_extra = 0

    def _flush(self) -> None:
        self._decode(self.ctx, self.rows.batch)
        self.rows.batch.clear()

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        self.rows.enqueue(tokens, pos0)

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        return alone(self.drafting(id_last, pos, n_max))

    def drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        """Its decodes yielded: every slot's draft model decodes in one (drafters.joint)."""
        rows, b = self.rows, self.rows.batch
        rows.pos, rows.n_extra = pos, 0
        if b.n_tokens == b.capacity:
            self._flush()
        b.add(id_last, pos, logits=n_max > 0)
        if n_max <= 0:
            return []  # the row stays queued for the next catch-up
        out: list[int] = []
        at = yield Need(self, self.ctx, b)
        b.clear()
        if self.ckpt is not None:
            self.ckpt.save()  # state after id_last: where a rejected draft rolls back to
        while (tok := rows.pick(at.out0)) is not None:
            out.append(tok)
            if len(out) >= n_max:
                break
            b.add(tok, pos + len(out), logits=True)
            rows.n_extra += 1
            at = yield Need(self, self.ctx, b)
            b.clear()
        return out

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        pos, extra = self.rows.pos, self.rows.n_extra
        keep = min(n_accepted, extra)  # accepted draft tokens already decoded at pos+1..pos+keep
        if extra > keep:
            if self.ckpt is not None:
                self.ckpt.restore()
                keep = 0
            if not lx.memory_seq_rm(self.ctx, self.seq, pos + 1 + keep, -1):
                raise lx.LlamaError(f"draft context refused to roll back to position {pos + keep}")
        self.rows.n_extra = 0
        if n_accepted > keep:
            self.rows.enqueue(list(drafts[keep:n_accepted]), pos + 1 + keep)

    def close(self) -> None:
        if self._owns:
            self.ctx.close()
