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
from mtp_cli.drafters.base import DRAFT_N_OUTPUTS, ContextPlan, Drafter, Loader, Models, check_same_vocab
from mtp_cli.errors import ConfigError, ModelFileError
from mtp_cli.sampling import ConfidenceProbe


class ModelDrafter(Drafter):
    """A separate draft model (same vocabulary), greedy, in its own context."""

    name = "draft"
    aliases = ("draft-simple",)
    summary = "a small draft model with the same vocabulary (`draft_model`)"
    order = 2
    draft_file = "required"
    drafts_with_model = True

    def __init__(
        self,
        model: lx.ModelPtr,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: Optional[int],
        n_vocab_target: int,
        p_min: float = 0.0,
        kv: Optional[lx.KvOptions] = None,
    ):
        super().__init__()
        self.model = model
        self.ctx = lx.create_context(
            model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, kv=kv, n_outputs_max=DRAFT_N_OUTPUTS
        )
        self.n_vocab = lx.n_vocab(model)
        self.n_vocab_target = int(n_vocab_target)
        self.recurrent = lx.model_has_recurrent_state(model)
        self.ckpt = lx.SeqCheckpoint(self.ctx) if self.recurrent else None
        self.batch = lx.Batch(lx.n_batch(self.ctx))
        self.p_min = float(p_min)
        self.probe = ConfidenceProbe(self.n_vocab)
        self._pos = 0  # position of the last id_last given to draft()
        self._n_extra = 0  # draft tokens decoded beyond pos (to roll back or keep)
        self.n_ctx = lx.n_ctx(self.ctx)

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
        return cls(
            models.drafting,
            n_ctx=plan.n_ctx,
            n_batch=plan.n_batch,
            n_threads=plan.n_threads,
            kv=plan.kv,
            n_vocab_target=lx.n_vocab(models.target),
        )

    def configure(self, cfg: GenConfig) -> None:
        self.p_min = float(cfg.draft_p_min)

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
            b.add_many(tokens[k : k + take], pos0 + k)
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
