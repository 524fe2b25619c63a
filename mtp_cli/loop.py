"""The verify loop: one generation of speculative decoding as one generator (mlx-lm's generate.py style).

Per step:

1. propose: the drafter proposes d1..dk (k <= N, the policy's; fewer near n_predict / the end of
   the context), each picked from its row as the target's row there will be edited, under a copy
   of its grammar (sampling.DraftSteer);
2. verify: the target decodes [id_last, d1..dk] in ONE batch with logits on every row; row i is
   sampled in order (greedy: argmax; otherwise llama.cpp's sampler chain, one random draw per
   emitted token) and d(i+1) is kept only while it equals that sample, so the output is exactly
   what plain decoding produces (up to ~1e-3 logit noise between batched and single-token
   kernels, which can flip a near-tie);
3. settle: the rejected cells are removed from the target (memory_seq_rm), the drafter rolls back
   and takes the accepted tokens;
4. emit: drafts[:a] + [the target's own token], stopping at EOG / n_predict.

Rollback of recurrent state (qwen35's gated delta net, any hybrid/recurrent arch): llama.cpp keeps
n_rs_seq per-token snapshots of the last decoded batch (slot s = state after the s-th token from
the end) and memory_seq_rm(p0) rolls back r = pos_max - p0 + 1 positions when 1 <= r <= n_rs_seq,
once between decodes (a second removal before the next decode is refused). Slot r is only valid if
the last batch had more than r tokens: removing a whole batch is accepted but silently restores a
stale state. The verify batch always keeps id_last, so r <= k <= N: the target gets n_rs_seq = N
exactly (Runtime), and every rollback is exact. Non-recurrent archs need no snapshots.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Generator, Sequence
from typing import Optional

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.drafters import Chain, Drafter
from mtp_cli.drafters.base import Drafting
from mtp_cli.drafters.joint import alone
from mtp_cli.drafters.recall import RECALL_ROWS
from mtp_cli.errors import LlamaError
from mtp_cli.memory import Held, Reuse
from mtp_cli.policy import DraftPolicy, StepClock
from mtp_cli.sampling import Chooser, DraftSteer, Probs, VerifySampled
from mtp_cli.stats import GenStats, Source, StopReason, TokenEvent
from mtp_cli.step_costs import StepCosts

_now = time.perf_counter


class VerifyLoop:
    """One generation on a target context with a drafter; `run(prompt)` is the generator."""

    def __init__(
        self,
        model: lx.Model,
        tgt: lx.Context,
        drafter: Drafter,
        policy: DraftPolicy,
        cfg: GenConfig,
        n_ctx: int,
        stats: GenStats,
        pieces: lx.PieceDecoder,
        verify_sampled: VerifySampled,
        eog_tokens: Sequence[int] = (),  # the model's (Runtime.eog_tokens), read with --ignore-eos
        costs: Optional[StepCosts] = None,  # what verify passes cost here: each one is measured into it
        seq: int = 0,  # the sequence (slot) it runs in: the drafter follows the same one
    ):
        self.model, self.tgt, self.drafter, self.policy, self.seq = model, tgt, drafter, policy, seq
        self.stats, self.pieces, self.verify_sampled = stats, pieces, verify_sampled
        self.costs = costs if costs is not None else StepCosts()
        self.n_ctx, self.n_max, self.n_min = n_ctx, stats.n_max, cfg.draft_n_min
        self.n_predict = cfg.n_predict if cfg.n_predict >= 0 else 1 << 62
        self.V = lx.n_vocab(model)
        self.chooser = Chooser(model, cfg, eog_tokens, verify_sampled)
        self.is_eog = lx.eog_checker(model)
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.vb = lx.Batch(max(lx.n_batch(tgt), self.n_max + 1), seq_id=seq)
        self.t_consumer = 0.0
        self.emitted = self.step = self.n_past = self.id_last = 0
        self.k = self.a = -1  # drafted / accepted by the last step (-1: before the first)
        self.a_last = 0  # drafts the last verify kept, whoever drafted them: its h row a is pos-1's
        self.asleep = False  # the drafter skipped steps (policy.sleep): it restarts before drafting again
        self.h_on: Optional[bool] = None  # the target computes its h rows (nextn embeddings) for its decodes
        self.shadow: Optional[list[int]] = None  # a shadow step's drafts, compared once the target decoded
        self.clock = StepClock()  # which steps the policy times
        self.decoded: list[int] = []  # the tokens the target's memory holds, in order
        self._prompt: Optional[np.ndarray] = None  # while prefilling: the prompt; positions _p0.. to decode
        self._p0 = self._recall_from = 0  # (asleep, a drafter that remembers keeps the rows from _recall_from on)
        self.suspended = False  # at a yield: a generation closed there leaves a known memory
        self.progress: Optional[Callable[[int, int], None]] = None  # (prompt positions done, of how many)

    def run(self, prompt: Sequence[int], reuse: Optional[Reuse] = None) -> Generator[TokenEvent, None, GenStats]:
        """`reuse`: what of the prompt the target already holds (only the rest is decoded). One decode
        of this loop's own rows at a time; a runner that batches several loops' rows calls begin,
        proposal, fill and after itself (mtp_cli.slots)."""
        st = self.stats
        t_start = _now()
        try:
            if not self.begin(prompt, reuse):
                return st
            while True:
                self.vb.clear()
                if not self.fill(self.vb):
                    return st
                t = _now()
                lx.decode(self.tgt, self.vb)
                if (yield from self.after(0, 0, _now() - t, observe=True)):
                    return st
        except KeyboardInterrupt:
            return self._stopped("interrupted")
        except GeneratorExit:
            raise
        except BaseException:
            st.stop_reason = "error"
            raise
        finally:
            self.finish(t_start)

    # -- the phases: begin once, then fill a batch / after its decode, until fill says done -------

    def begin(self, prompt: Sequence[int], reuse: Optional[Reuse]) -> bool:
        """Ready the memory for the prompt (what it does not hold of it is decoded by the first fills);
        False when nothing is to be generated."""
        self._t_begin = _now()
        if self.n_predict == 0:
            self._stopped("n_predict")
            return False
        tgt, d = self.tgt, self.drafter
        keep = reuse.keep if reuse else 0
        if reuse is None:
            lx.memory_seq_clear(tgt, self.seq)
            d.begin(prompt)
        else:
            if reuse.donor is not None:  # (a prefix another sequence holds: memory.borrowed)
                lx.memory_seq_copy(tgt, reuse.donor, self.seq)
            if reuse.rewound and not lx.memory_seq_rm(tgt, self.seq, keep, -1):
                raise LlamaError(f"the target context refused to drop positions {keep}..{reuse.held - 1}")
            if reuse.donor is None:
                d.resume(prompt, keep, reuse.asleep, reuse.rewound)
            else:  # (from what the donor's drafter holds, where it can)
                d.adopt(reuse.lender, prompt, keep)
        self.decoded = list(prompt)
        self.costs.unobserved()  # (the prompt's decodes come first)
        # an off policy (asleep since the last generation, or a fresh controller): drafters that can sleep decode
        # none of the prompt (2-3% of a short request); those that remember keep its last rows (drafters.recall)
        self.asleep = bool(self.policy.sleep and d.can_sleep and self.n_max > 0)
        if self.asleep and isinstance(d, Chain):
            d.sleeping = True
        remembers = self.asleep and self.policy.wakes and d.remembers  # (the target computes their h rows: fill)
        self._recall_from = len(prompt) - RECALL_ROWS if remembers else len(prompt)
        self._prompt = np.asarray(prompt, dtype=np.int32)
        self._p0 = keep
        if self.progress is not None:
            self.progress(keep, len(prompt))
        return True

    @property
    def prefilling(self) -> bool:
        return self._prompt is not None

    def in_memory(self) -> list[int]:
        """The tokens the target's memory holds (of the prompt, only the chunks decoded so far)."""
        return self.decoded[: self._p0] if self.prefilling else self.decoded

    def settled(self) -> Held:
        """What stays in memory while this runs: the prompt's decoded chunks (memory.borrowed)."""
        return Held(self.in_memory()[: self.stats.n_prompt], self.drafter, self.asleep)

    def fill(self, batch: lx.Batch, drafts: Optional[list[int]] = None) -> bool:
        """Add this loop's rows for the next decode: a chunk of the prompt (as much as n_batch and the
        batch's room take), or a step's [id_last, *drafts] (the caller leaves room for n_max + 1
        rows; `drafts`: its proposal's, run by the caller, else run alone here). False: the
        generation is done (n_predict, a full context)."""
        if self._prompt is not None:
            toks, p0 = self._prompt, self._p0
            n = min(lx.n_batch(self.tgt), batch.capacity - batch.n_tokens, len(toks) - p0)
            self._chunk = toks[p0 : p0 + n]
            self._h_rows(not self.asleep or p0 + n > self._recall_from)
            batch.add_many(self._chunk, p0, seq_id=self.seq, logits_last=p0 + n >= len(toks))
            return True
        if drafts is None:
            step = self.proposal()
            if step is None:
                return False
            drafts = alone(step)
        self._drafts = drafts
        self.step += 1
        batch.add(self.id_last, self.n_past, seq_id=self.seq, logits=True)
        for i, tok in enumerate(drafts):
            batch.add(tok, self.n_past + 1 + i, seq_id=self.seq, logits=True)
        return True

    def after(self, row0: int, out0: int, dt: float, observe: bool = False) -> Generator[TokenEvent, None, bool]:
        """The decode ran, this loop's rows from batch row `row0` (output row `out0`): follow a prompt
        chunk, or verify and settle the step; yield its tokens; True when the generation stops here.
        observe: the decode held this loop's rows alone (its time is a verify cost of this machine)."""
        self.drafter.h0 = row0
        if self._prompt is not None:
            return (yield from self._prefilled(row0, out0))
        drafts = self._drafts
        a, nxt = self._verify(drafts, row0, out0, dt, observe)
        self._settle(drafts, a, nxt)
        self.clock.settled(bool(drafts) and self._self_sized_step())
        for j in range(a):
            if (yield from self._emit(drafts[j], "draft", j)):
                return True
        return (yield from self._emit(nxt, "target", a))

    def _prefilled(self, row0: int, out0: int) -> Generator[TokenEvent, None, bool]:
        """A prompt chunk was decoded: the drafter follows it; after the last, the first token."""
        prompt, chunk, d, st = self._prompt, self._chunk, self.drafter, self.stats
        assert prompt is not None
        if not self.asleep or isinstance(d, Chain):  # (a chain's sleeping members skip it)
            d.on_prefill(chunk, self._p0)
        # (h rows on for it: fill; batched, another slot's may have turned them on for a chunk this one keeps none of)
        if self.asleep and self.h_on and self._p0 + len(chunk) > self._recall_from:
            d.remember(chunk, self._p0)
        self._p0 += len(chunk)
        if self._p0 < len(prompt):
            if self.progress is not None:
                self.progress(self._p0, len(prompt))
            return False
        self._prompt, self.a_last = None, len(chunk) - 1  # (a head woken now starts from h row a_last)
        row = lx.logits_rows(self.tgt, out0 + 1, self.V)[out0]
        first = self.id_last = self.chooser.first(self.tgt, row0 + len(chunk) - 1, row, self.decoded)
        self.n_past = len(prompt)
        d.t_decode, d.n_decode = 0.0, 0  # the drafter's generation costs start now
        st.t_prompt = _now() - self._t_begin
        if self.progress is not None:
            self.progress(len(prompt), len(prompt))
        stop = yield from self._emit(first, "target", 0)
        self.clock.prompt_done()
        if st.stop_reason != "eog":
            self.policy.can_sleep = d.can_sleep
            self.policy.begin(self.t_consumer)  # (a generation that ends at its first token ran 0 steps)
        return stop

    def _room(self) -> int:
        """Free positions for the next step (id_last needs one, each draft token one more); 0: stop."""
        if self.emitted >= self.n_predict:
            self._stopped("n_predict")
            return 0
        room = self.n_ctx - self.n_past
        if room <= 0:
            self._stopped("ctx_full")
        return max(room, 0)

    def proposal(self) -> Optional[Drafting]:
        """This step's drafting (run it alone, or beside other loops': drafters.joint); None: the
        generation is done."""
        room = self._room()
        if room <= 0:
            return None
        self.clock.tick(self.policy, _now(), self.t_consumer)
        return self._propose(room)

    def _propose(self, room: int) -> Drafting:
        """The drafts to verify this step, as the policy says (it may put the drafter to sleep, or
        ask for a shadow step whose draft is only compared with the target's token)."""
        p, d = self.policy, self.drafter
        n = p.step(self.k, self.a, self.t_consumer, self.step)
        limit = min(self.n_max, room - 1, self.n_predict - self.emitted - 1)
        k_max, limit = min(n, limit), 0 if p.hold else limit  # (limit: what a self-sized drafter may draft)
        drafts: list[int] = []
        if p.sleep and d.can_sleep and k_max <= 0:
            self.asleep = True
            self._h_rows(p.quiet <= 0)  # (only the step before the policy may wake the drafter needs one)
            if isinstance(d, Chain):  # (its members that cannot sleep, a lookup, go on drafting)
                d.sleeping = True
                if self.n_max > 0:  # (a shadow step's is asked for none: kept in step all the same)
                    drafts = yield from self._draft(0, 0 if p.shadow else max(limit, 0))
        else:
            if self.asleep:
                d.restart(self.n_past, bool(self.h_on), self.a_last)  # (pos-1 is row a_last of the last decode)
                self.asleep = False
                self._h_rows(True)
            if self.n_max > 0:  # (a shadow step judges the policy's drafter: a self-sized one sits it out)
                drafts = yield from self._steered(k_max, 0 if p.shadow else max(limit, 0))
            if p.shadow:
                self.shadow, drafts = drafts, []
        return drafts if len(drafts) >= self.n_min else []  # llama.cpp: drafts shorter than n_min are discarded

    def _h_rows(self, on: bool) -> None:
        """Whether the target computes h rows: only while its drafter reads them (an asleep one does
        not). Over RPC fetching them is one more round trip per decode."""
        if self.drafter.target_h and on is not self.h_on:
            lx.set_embeddings_nextn(self.tgt, on, False)
            self.h_on = on

    def _steered(self, k_max: int, limit: int) -> Drafting:
        """The drafter's drafts, each picked from its row as the target's verified row at the same
        position will be edited (penalties, biases) and among what a copy of the target's grammar
        allows, when the drafter picks from rows of its own."""
        d, ch = self.drafter, self.chooser
        if d.rows is None or k_max <= 0 or (ch.grammar is None and not ch.edits.active):
            return (yield from self._draft(k_max, limit))
        g = ch.grammar.copy() if ch.grammar is not None else None
        d.rows.steer = DraftSteer(ch.edits, self._history(), g)
        try:
            return (yield from self._draft(k_max, limit))
        finally:
            d.rows.steer = d.rows.plain
            if g is not None:
                g.close()

    def _draft(self, k_max: int, limit: int) -> Drafting:
        """The drafter's drafts: up to the policy's N (k_max), or up to `limit` for a drafter that
        sizes its own; a chain's first member that proposes."""
        d = self.drafter
        n_for = lambda m: limit if m.self_sized else k_max  # noqa: E731
        if isinstance(d, Chain):
            return (yield from d.drafting_each(self.id_last, self.n_past, n_for, self.n_min))
        return (yield from d.drafting(self.id_last, self.n_past, n_for(d)))

    def _history(self) -> Sequence[int]:
        """The tokens before this step's first verified row, as far back as the penalties look (none
        without penalties)."""
        edits = self.chooser.edits
        return [*self.decoded[-edits.last_n :], self.id_last] if edits.penalty is not None else ()

    def _verify(self, drafts: list[int], row0: int, out0: int, dt: float, observe: bool) -> tuple[int, int]:
        """(drafts accepted, the target's next token) from the decode of [id_last, *drafts]."""
        st, k = self.stats, len(drafts)
        st.t_target_decode += dt
        st.n_verify += 1
        if observe:
            self.costs.observe(k, dt)
        rows = lx.logits_rows(self.tgt, out0 + k + 1, self.V)[out0:]
        return self.chooser.verify(self.tgt, rows, drafts, self._history(), row0)

    def _settle(self, drafts: list[int], a: int, nxt: int) -> None:
        """Count the step, roll back the rejected cells, let the drafter and the policy see the result."""
        st, k = self.stats, len(drafts)
        if k:
            st.count_drafts(k, a)
            if a < k and not lx.memory_seq_rm(self.tgt, self.seq, self.n_past + a + 1, -1):
                raise LlamaError(
                    f"the target context refused to roll back {k - a} positions (n_rs_seq {lx.n_rs_seq(self.tgt)})"
                )
        if self.shadow is not None:
            if self.shadow:
                self.policy.shadow_result(self.shadow[0] == nxt)
            self.shadow = None
        if not self.asleep or isinstance(self.drafter, Chain):  # (a chain's sleeping members skip it)
            self.drafter.accept(a, drafts)
        self.decoded += [self.id_last, *drafts[:a]]  # what the target now holds at n_past..
        self.n_past, self.id_last = self.n_past + a + 1, nxt
        # the policy hears of the drafts its N sized: a self-sized drafter's (the lookup's) are not its
        self.k, self.a = (0, 0) if k and self._self_sized_step() else (k, a)
        self.a_last = a

    def _self_sized_step(self) -> bool:
        """Whether this step's drafts came from a drafter that sizes its own."""
        by = self.drafter.proposer if isinstance(self.drafter, Chain) else self.drafter
        return by is not None and by.self_sized

    def _emit(self, tok: int, source: Source, row: int) -> Generator[TokenEvent, None, bool]:
        """Yield one token, chosen at `row` of the last choice (the caller's time is kept apart);
        True when generation stops here."""
        if self.is_eog(tok):
            self._stopped("eog")
            return True
        self.emitted += 1
        self.stats.n_tokens, self.stats.n_first = self.emitted, 1
        t = _now()
        self.suspended = True
        probs: Optional[Probs] = self.chooser.probs[row] if self.chooser.probs else None
        text = self.utf8.decode(self.pieces(tok))
        yield TokenEvent(tok, text, source, self.step, *(probs or (None, ())))
        self.suspended = False
        self.t_consumer += _now() - t
        if self.emitted >= self.n_predict:
            self._stopped("n_predict")
            return True
        return False

    def _stopped(self, reason: StopReason) -> GenStats:
        self.stats.stop_reason = reason
        return self.stats

    def finish(self, t_start: float) -> None:
        """The generation ended (its stats completed, its policy and sampler told)."""
        st = self.stats
        if st.stop_reason is None:
            st.stop_reason = "interrupted"  # closed early by the consumer
        end = _now()
        if st.t_prompt == 0.0:
            st.t_prompt = end - t_start
        else:
            st.t_gen = max(0.0, end - t_start - st.t_prompt - self.t_consumer)
        st.t_consumer = self.t_consumer
        st.t_draft_decode, st.n_draft_decode = self.drafter.t_decode, self.drafter.n_decode
        self.clock.tick(self.policy, end, self.t_consumer)
        self.policy.end(self.step)
        self.chooser.close()


__all__ = ["VerifyLoop"]
