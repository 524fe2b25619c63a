"""The Drafter interface: where the draft tokens of one speculative step come from.

A drafter class declares its spec type (`name`, `aliases`, a one-line `summary`), what must be
loaded for it (`draft_file`: whether `-md` is none of its business, optional or required; the
class hooks check the files and load the model it drafts with) and builds itself from the config
(`create`). The registry (mtp_cli.drafters) finds every Drafter subclass in this package: a new
spec type is one new module.

The verify loop (mtp_cli.loop) drives an instance:

    configure(cfg)                    per generation: the settings it reads (p_min, n-gram sizes)
    begin(prompt)                     a new generation: reset state, clear own context(s)
    resume(prompt, keep, asleep, rewound)
                                      (drafters with can_resume) a new generation whose prompt
                                      shares prompt[:keep] with what the last one left in the
                                      target, which holds just that now; `rewound`: the target
                                      dropped positions keep.. (else it held exactly those);
                                      `asleep`: the last generation ended with the drafter skipped
    adopt(lender, prompt, keep)       (drafters with can_resume) instead of resume: the target holds
                                      prompt[:keep] copied from another sequence, followed there by
                                      `lender` (this kind's drafter, or None): copy what it holds
    on_prefill(tokens, pos0)          the target just decoded a prompt chunk at pos0..
    remember(tokens, pos0)            (drafters that remember) the same while it sleeps: kept, to
                                      re-read at restart (mtp_cli.drafters.recall)
    draft(id_last, pos, n_max)        up to n_max tokens to follow id_last (which sits at `pos`
                                      and is not yet in the target's memory); n_max may be 0
    drafting(id_last, pos, n_max)     the same as a generator of the decodes it waits on (Need),
                                      so that drafters sharing a context decode together
                                      (mtp_cli.drafters.joint); by default, draft() decoding alone
    accept(n_accepted, drafts)        the target kept drafts[:n_accepted] (+ its own token,
                                      which comes back as the next id_last); roll back the rest
    restart(pos, h)                   (drafters with can_sleep) resume after the loop skipped
                                      draft()/accept() for some steps (a policy switched drafting
                                      off); the target holds 0..pos-1 and its last decode was one
                                      plain token at pos-1, with its h row if `h` (an asleep
                                      drafter's target computes none but for the prompt)

Positions: the target holds 0..pos-1 when draft() is called; id_last is at pos, draft i (0-based)
at pos+1+i.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

import numpy as np

from gguf_tools.gguf_file import GGUFFile
from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.drafters.rows import DraftRows
from mtp_cli.errors import MtpError, VocabMismatchError
from mtp_cli.step_costs import StepCosts

# A drafter's decode reads one output row (the draft row; catch-up rows have none): its context
# reserves room for one, as llama.cpp's own draft contexts do (common/speculative.cpp:2480,
# n_outputs_max = n_parallel). The default (n_batch rows of logits) costs n_batch x n_vocab floats.
DRAFT_N_OUTPUTS = 1

_now = time.perf_counter

# (file, role, load_mtp) -> the loaded model, owned and freed by the runtime; failures are
# ModelFileErrors that name the file's role
Loader = Callable[[GGUFFile, str, bool], lx.Model]


@dataclass(frozen=True)
class Need:
    """A decode a drafting step waits on: `batch`'s rows in `ctx`, for `drafter` (who is charged its
    time), with the context's head `layer` when it has several (chained heads: set for the whole
    context, so only needs of one layer share a decode). It is sent back where those rows sat in the
    batch that was decoded (Placed). `alone`: it shares no decode (rows without outputs in a context
    whose h rows are extracted by output: another need's h would be read off them)."""

    drafter: Drafter
    ctx: lx.Context
    batch: lx.Batch
    layer: Optional[int] = None
    alone: bool = False


@dataclass(frozen=True)
class Placed:
    """Where a Need's rows sat in the decoded batch: its first row, and the output rows before it."""

    row0: int = 0
    out0: int = 0


# a drafting step: it yields the decodes it waits on and returns its drafts; after its first yield it
# decodes only through yields (the outputs it reads are those of a decode other drafters shared)
Drafting = Generator[Need, Placed, list[int]]


@dataclass
class Models:
    """What a runtime loaded: the target, and the model its drafter drafts with (None: no model;
    the target itself for its own MTP head), with the files they came from."""

    target: lx.Model
    target_file: GGUFFile
    drafting: Optional[lx.Model] = None
    draft_file: Optional[GGUFFile] = None  # the `draft_model` file (-md), when one was given

    def drafter_model(self) -> lx.Model:
        """The model the drafter drafts with (its class's load_draft set it)."""
        if self.drafting is None:
            raise MtpError("no model was loaded to draft with")
        return self.drafting


@dataclass(frozen=True)
class ContextPlan:
    """Where a drafter lives: the target context it pairs with and the sizes to create its own with."""

    target: lx.Context
    n_ctx: int
    n_batch: int
    n_threads: Optional[int]
    kv: Optional[lx.KvOptions] = None  # the target's KV cache settings, for a drafter's own context
    costs: Optional[StepCosts] = None  # what verify passes cost on this target (the loop measures them)
    seq: int = 0  # the sequence (slot) the drafter follows, in the target's context and its own
    n_seq: int = 1  # sequences the target context holds (a drafter's own context holds as many)
    # the drafter contexts every sequence's drafter shares, by kind, owned (closed) by the holder of
    # this dict (mtp_cli.contexts); None: a drafter's context is its own
    shared: Optional[dict[tuple[Any, ...], lx.Context]] = field(default=None, compare=False)

    def context(self, key: tuple[Any, ...], make: Callable[[], lx.Context]) -> lx.Context:
        """The drafter context of kind `key` all sequences share (made once), or one of its own."""
        if self.shared is None:
            return make()
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]


class Drafter:
    """Base: never drafts. Subclasses override what they need."""

    name: ClassVar[str] = ""  # the spec type; "" for this base
    aliases: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    order: ClassVar[int] = 100  # place in the CLI's list
    draft_file: ClassVar[Literal["none", "optional", "required"]] = "none"
    drafts_with_model: ClassVar[bool] = False  # it needs a model loaded for it (load_draft)
    target_h: ClassVar[bool] = False  # the target must compute its h rows (nextn embeddings) for it
    #: True if steps may be skipped (restart() resumes): MTP heads, whose input is mostly the
    #: target's h row; not n-gram or draft-model drafters, which need every token of the history
    can_sleep: ClassVar[bool] = False
    #: True if, asleep, it keeps the prompt's rows to re-read on waking (`remember`: the target
    #: computes the prompt's h rows for it); a chain's: any member's
    remembers: bool = False
    #: True if resume() can continue its state into a generation that extends the last one
    can_resume: ClassVar[bool] = False
    #: False for plain decoding (the spec type that never drafts)
    drafts: ClassVar[bool] = True
    #: True if it sizes its own drafts (up to the step's limit: the room left, draft_n_max), so the
    #: policy's N does not apply to it (the text lookup)
    self_sized: ClassVar[bool] = False
    seq: int = 0  # the sequence it follows (ContextPlan.seq): every batch row and memory edit it makes
    h0: int = 0  # its sequence's first row in the target's last decode (the loop sets it: h rows are by batch row)

    #: a hard cap on the draft length from the drafter itself (chained heads: one per head)
    n_max_limit: Optional[int] = None
    #: positions its own context holds (None: it has none)
    n_ctx: Optional[int] = None
    #: the draft rows it picks from (drafters that decode in a context of their own)
    rows: Optional[DraftRows] = None

    def __init__(self) -> None:
        self.t_decode = 0.0  # seconds inside llama_decode (draft context)
        self.n_decode = 0  # llama_decode calls on the draft context

    # -- the spec: checks and loading (class hooks; the runtime calls them before creating one) ----

    @classmethod
    def check_config(cls, cfg: GenConfig) -> None:
        """Refuse settings this drafter cannot use (ConfigError)."""

    @classmethod
    def check_files(cls, target: GGUFFile, draft: Optional[GGUFFile]) -> None:
        """Refuse files this drafter cannot use, before llama.cpp loads any (typed MtpErrors)."""

    @classmethod
    def target_loads_head(cls, draft: Optional[GGUFFile]) -> bool:
        """Whether the target must be loaded with its MTP head blocks (load_mtp)."""
        return False

    @classmethod
    def load_draft(cls, models: Models, load: Loader) -> None:
        """Load what it drafts with into models.drafting (after the target; `load` checks files)."""

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> Drafter:
        return cls()

    # -- per generation ----------------------------------------------------------------------

    def configure(self, cfg: GenConfig) -> None:
        pass

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool, rewound: bool) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot resume")

    def adopt(self, lender: Optional[Drafter], prompt: Sequence[int], keep: int) -> None:
        """(drafters with can_resume) the target holds prompt[:keep], copied from another sequence
        whose drafter of this kind is `lender` (None: another kind): start from what it holds where
        that can be copied, else cold (as after a sleep)."""
        self.resume(prompt, keep, True, True)

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        pass

    def remember(self, tokens: np.ndarray, pos0: int) -> None:
        """(drafters that remember) a prompt chunk decoded while it sleeps."""

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        return []

    def drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        """draft() as a generator of the decodes it waits on; by default it decodes alone, inside draft()."""
        out = self.draft(id_last, pos, n_max)
        yield from ()
        return out

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        pass

    def restart(self, pos: int, h: bool = True, row: int = 0) -> None:
        """Resume cold at pos after skipped steps; the target's last decode holds pos-1 at `row`
        (h: whether it computed h rows)."""

    def close(self) -> None:
        pass

    def _decode(self, ctx: lx.Context, batch: lx.Batch) -> None:
        t = _now()
        lx.decode(ctx, batch)
        self.charge(_now() - t)

    def charge(self, seconds: float) -> None:
        """Count a decode of its own (or its share of one it shared) into its costs."""
        self.t_decode += seconds
        self.n_decode += 1


class HeadProbe:
    """Times the head's decodes as a step runs them, without advancing its memory (the cost model's).
    Call after begin/on_prefill/catch_up of a prompt."""

    def __init__(
        self,
        ctx: lx.Context,
        n_embd: int,
        pending_h: np.ndarray,
        all_outputs: bool,
        shares_memory: bool,
        n_rows: int,
        seq: int = 0,
    ):
        self.ctx, self.pending_h, self.all_outputs, self.seq = ctx, pending_h, all_outputs, seq
        self.batch = lx.Batch(n_rows, n_embd, seq)
        self.shares_memory = shares_memory  # no catch-up rows: a step's first decode has one row

    def decode(self, tokens: Sequence[int], pos: int) -> float:
        """Seconds of one head decode of `tokens` from pos (all at pos when sharing the target's
        memory), paired with the pending h row, with the outputs a step's merged decode has."""
        b = self.batch
        b.clear()
        for j, tok in enumerate(tokens):
            out = self.all_outputs or j == len(tokens) - 1
            b.add(tok, pos if self.shares_memory else pos + j, logits=out, h=self.pending_h)
        t = _now()
        lx.decode(self.ctx, b)
        return _now() - t

    def reset(self, pos: int) -> None:
        """Drop the probe's rows from pos on."""
        if not self.shares_memory:
            lx.memory_seq_rm(self.ctx, self.seq, pos, -1)


def check_same_vocab(target: lx.Model, draft: lx.Model, target_file: GGUFFile, draft_file: GGUFFile) -> None:
    """The rule llama.cpp applies to draft models (common_speculative_are_compatible): same
    vocabulary type and special tokens, sizes within 128 (padding), identical shared entries."""
    what = f"{draft_file.path.name} has another vocabulary than {target_file.path.name}"
    if lx.vocab_type(target) != lx.vocab_type(draft):
        raise VocabMismatchError(f"{what} (tokenizer type {lx.vocab_type(draft)} vs {lx.vocab_type(target)})")
    nt, nd = lx.n_vocab(target), lx.n_vocab(draft)
    if abs(nt - nd) > 128:
        raise VocabMismatchError(f"{what} (n_vocab {nd} vs {nt})")
    if lx.vocab_special(target) != lx.vocab_special(draft):
        raise VocabMismatchError(f"{what} (BOS/EOS {lx.vocab_special(draft)} vs {lx.vocab_special(target)})")
    for i in range(min(nt, nd)):
        a, b = lx.token_text(target, i), lx.token_text(draft, i)
        if a != b:
            raise VocabMismatchError(f"{what} (token {i}: {b!r} vs {a!r})")


__all__ = [
    "HeadProbe",
    "Drafter",
    "Drafting",
    "Need",
    "Placed",
    "Models",
    "ContextPlan",
    "Loader",
    "check_same_vocab",
]
