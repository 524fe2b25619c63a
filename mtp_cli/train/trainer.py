"""The training loop: the trunk frozen (its rows come from the store), the head block trained.

Per batch of whole sequences (the head's own causal attention over each, as at decode time):

- draft step 1 at every row j: token x_j with the trunk's h of row j-1 -> the trunk's distribution
  at row j (its prediction of the token after x_j);
- draft step 2 (`unroll`, from `unroll_from` of the budget on): token x_j with the HEAD's own output h
  of row j-1, attending to the step-1 rows 0..j-1 and itself -> the trunk's distribution at row j;
  only where x_j is the trunk's own greedy token after row j-1 (a draft that would have been
  accepted), gradients through both steps.

Losses: "kl" = cross-entropy to the trunk's top-K distribution (renormalised; = KL up to a
constant), "ce" = cross-entropy on the trunk's top-1 token, "mix" = their mean; plus (feature_weight)
a smooth-L1 pull of the head's h towards the trunk's h of the same row (step 2 reads the head's h
where the trunk's would be). Rows of a prompt weigh `prompt_weight` (drafting starts after it). The
softmax runs over sampled candidate columns (`candidates`: the batch's top-K, the trunk's most
frequent predictions and random ones): the vocabulary matmul was 2/3 of a step. Held-out agreement
is always over the full vocabulary. Deterministic for a seed (one thread); stops at `minutes` or
`max_steps`; checkpoints (weights, optimizer, sampler state) every `ckpt_every_s` so a killed run
resumes.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gguf_tools.atomic import atomic_output
from mtp_cli.errors import TrainDataError
from mtp_cli.train.batches import LOSSES, Batcher, feature_loss
from mtp_cli.train.batches import loss as loss_fn
from mtp_cli.train.data import Store
from mtp_cli.train.head import MtpHead
from mtp_cli.train.progress import RunClock, TrainProgress, TrainResult


@dataclass(frozen=True)
class TrainConfig:
    minutes: float = 10.0  # wall-clock budget of this run (0 with max_steps: no time limit)
    max_steps: int | None = None
    batch_seqs: int = 4
    lr: float = 1.5e-3  # measured on SmolLM2 (2.5 min runs): 1.5e-3 beat 5e-4
    warmup: int = 20
    weight_decay: float = 0.1  # AdamW's; measured on a 30-min run's data: +1.1 points held-out top-1 over 0
    loss: str = "kl"
    unroll: bool = True
    unroll_from: float = 0.5  # train step 2 once this share of the budget (time, else max_steps) is spent
    step2_weight: float = 0.5
    grad_clip: float = 1.0
    seed: int = 0
    eval_every_s: float = 60.0
    eval_rows: int = 2048  # held-out rows evaluated (the first sequences of the held-out split)
    ckpt_every_s: float = 120.0
    n_threads: int = 1
    feature_weight: float = 1.0  # + this x smooth-L1(head h, trunk h) on step 1 (0: token loss only)
    prompt_weight: float = 0.2  # loss weight of a prompt's own rows (answers and text: 1)
    candidates: int = 2048  # >0: softmax over the batch's top-K tokens + this many of the trunk's most frequent
    # predictions + as many random ones (sampled softmax: the vocabulary matmul is most of a step); 0: full


def _leading(seqs: list[dict], rows: int) -> list[dict]:
    """The first sequences of `seqs` until `rows` rows are reached."""
    out, n = [], 0
    for s in seqs:
        if n >= rows:
            break
        out.append(s)
        n += s["len"]
    return out


class Trainer:
    def __init__(
        self,
        head: MtpHead,
        store: Store,
        cfg: TrainConfig = TrainConfig(),
        checkpoint: str | os.PathLike[str] | None = None,
    ):
        if cfg.loss not in LOSSES:
            raise ValueError(f"unknown loss {cfg.loss!r} ({', '.join(LOSSES)})")
        self.head, self.store, self.cfg = head, store, cfg
        self.batcher = Batcher(store)
        # by source key: the order sequences finished in (threads) must not change what a seed trains on
        self.train_seqs = sorted(store.split("train"), key=lambda s: s["key"])
        self.heldout = _leading(sorted(store.split("heldout"), key=lambda s: s["key"]), cfg.eval_rows)
        self.fit_probe = _leading(self.train_seqs, cfg.eval_rows)  # keys are hashes: a random sample
        if not self.train_seqs:
            raise ValueError("no training sequences collected")
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
        self._frequent: torch.Tensor | None = None  # sampled softmax: the trunk's most frequent predictions
        self._lut: torch.Tensor | None = None
        self.step = 0
        self.elapsed_total = 0.0  # over every run of this checkpoint
        self.t_save = 0.0  # seconds the last checkpoint took
        self.history: list[dict] = []
        self.ckpt = Path(checkpoint) if checkpoint else None
        if self.ckpt is not None and self.ckpt.exists():
            self._load()

    # -- checkpoints --------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.ckpt is not None
        try:
            st = torch.load(self.ckpt, weights_only=False)
            self.head.w.load_state_dict(st["weights"])
            self.opt.load_state_dict(st["opt"])
        except (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError, pickle.UnpicklingError) as e:
            raise TrainDataError(
                f"{self.ckpt}: not a checkpoint of this head ({type(e).__name__}); delete it, "
                "or use another work folder (`work`)"
            ) from None
        for g in self.opt.param_groups:  # (the checkpoint's own would win otherwise; lr is set every step)
            g["weight_decay"] = self.cfg.weight_decay
        self.step, self.elapsed_total, self.history = st["step"], st["elapsed_total"], st["history"]
        self.rng.bit_generator.state = st["rng"]
        torch.set_rng_state(st["torch_rng"])

    def save(self) -> None:
        if self.ckpt is None:
            return
        with atomic_output(self.ckpt) as tmp:
            torch.save(
                {
                    "weights": self.head.w.state_dict(),
                    "opt": self.opt.state_dict(),
                    "step": self.step,
                    "elapsed_total": self.elapsed_total,
                    "history": self.history,
                    "rng": self.rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(),
                    "config": asdict(self.cfg),
                },
                tmp,
            )

    # -- one step -------------------------------------------------------------------------------

    def _progress(self, frac: float, steps_done: int) -> float:
        if self.cfg.minutes > 0:
            return frac
        return steps_done / self.cfg.max_steps if self.cfg.max_steps else 1.0

    def _columns(self, ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(candidate columns or None for the full vocabulary, ids remapped to them)."""
        n = self.cfg.candidates
        if n <= 0:
            return None, ids
        V = self.head.output.shape[0]
        if self._frequent is None:
            top1 = np.asarray(self.store.array("topk_id.i32")[:, 0])
            counts = np.bincount(top1, minlength=V)
            self._frequent = torch.from_numpy(np.argsort(-counts, kind="stable")[:n].astype(np.int64))
            self._lut = torch.full((V,), -1, dtype=torch.int64)
        assert self._lut is not None
        rand = torch.randint(0, V, (n,))
        cols = torch.unique(torch.cat([ids.reshape(-1), self._frequent, rand]))
        self._lut[cols] = torch.arange(len(cols))
        remapped = self._lut[ids]
        self._lut[cols] = -1
        return cols, remapped

    def losses(self, b: dict[str, torch.Tensor], unroll: bool | None = None) -> tuple[torch.Tensor, int]:
        head, cfg = self.head, self.cfg
        hout, k, v = head(b["tokens"], b["hprev"])
        m = b["valid"]
        cols, ids = self._columns(b["ids"])
        loss = loss_fn(head.logits(hout[m], cols), ids[m], b["lp"][m], cfg.loss, b["weight"][m])
        if cfg.feature_weight:  # hout should be the trunk's own h of the row: it is step 2's input
            loss = loss + cfg.feature_weight * feature_loss(hout[m], b["hcur"][m], b["weight"][m])
        rows = int(m.sum())
        m2 = b["valid2"]
        if (cfg.unroll if unroll is None else unroll) and bool(m2.any()):
            h2 = torch.cat([torch.zeros_like(hout[:, :1]), hout[:, :-1]], dim=1)
            hout2 = head.step2(b["tokens"], h2, k, v)
            loss = loss + cfg.step2_weight * loss_fn(
                head.logits(hout2[m2], cols), ids[m2], b["lp"][m2], cfg.loss, b["weight"][m2]
            )
            rows += int(m2.sum())
        return loss, rows

    def _lr(self, frac: float) -> float:
        cfg = self.cfg
        warm = min(1.0, (self.step + 1) / max(1, cfg.warmup))
        return cfg.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, max(0.0, frac)))))

    @torch.no_grad()
    def evaluate(self, seqs: list[dict] | None = None) -> tuple[float, float]:
        """Top-1 agreement with the trunk on the rows drafting sees (answers, text) of `seqs` (default: the
        held-out ones): (draft step 1, draft step 2 where step 1's token is the trunk's)."""
        head = self.head
        was_training = head.training
        head.eval()  # float32 block (a fast head trains in bfloat16)
        try:
            return self._evaluate(self.heldout if seqs is None else seqs)
        finally:
            head.train(was_training)

    def _evaluate(self, seqs: list[dict]) -> tuple[float, float]:
        head = self.head
        hit1 = n1 = hit2 = n2 = 0
        for i in range(0, len(seqs), self.cfg.batch_seqs):
            b = self.batcher.make(seqs[i : i + self.cfg.batch_seqs])
            hout, k, v = head(b["tokens"], b["hprev"])
            m = b["valid"] & b["answer"]
            hit1 += int((head.logits(hout[m]).argmax(-1) == b["ids"][m][:, 0]).sum())
            n1 += int(m.sum())
            m2 = b["valid2"] & b["answer"]
            if bool(m2.any()):
                h2 = torch.cat([torch.zeros_like(hout[:, :1]), hout[:, :-1]], dim=1)
                hout2 = head.step2(b["tokens"], h2, k, v)
                hit2 += int((head.logits(hout2[m2]).argmax(-1) == b["ids"][m2][:, 0]).sum())
                n2 += int(m2.sum())
        return hit1 / max(1, n1), hit2 / max(1, n2)

    def run(
        self, progress: Callable[[TrainProgress], None] | None = None, should_stop: Callable[[], bool] | None = None
    ) -> TrainResult:
        cfg = self.cfg
        torch.set_num_threads(max(1, cfg.n_threads))
        budget = cfg.minutes * 60.0 if cfg.minutes > 0 else math.inf
        total_budget = self.elapsed_total + budget if math.isfinite(budget) else 0.0  # 0: no decay
        t0 = time.perf_counter()  # (the budget covers the run's evaluations and checkpoint too)
        init = self.evaluate() if self.heldout else (0.0, 0.0)
        r = RunClock(t0, budget, init, reserve=self._end_cost(time.perf_counter() - t0))
        self._record(r, loss=False)
        self.head.train()

        def report(final: bool = False) -> None:
            if progress:
                loss = float(np.mean(r.losses[-20:])) if r.losses else math.nan
                progress(
                    TrainProgress(
                        self.step,
                        r.elapsed(),
                        loss,
                        r.last[0] if self.heldout else None,
                        r.last[1] if self.heldout else None,
                        r.per_s(r.steps),
                        r.per_s(r.rows),
                        budget,
                        final,
                    )
                )

        report()
        try:
            self._steps(r, budget, total_budget, report, should_stop)
        except KeyboardInterrupt:  # keep what was trained: the next run resumes from it
            self._save_at(r.elapsed())
            self.elapsed_total += r.elapsed()
            raise
        return self._end(r, report)

    def _steps(
        self,
        r: RunClock,
        budget: float,
        total_budget: float,
        report: Callable[..., None],
        should_stop: Callable[[], bool] | None,
    ) -> None:
        cfg = self.cfg
        t_eval = t_ckpt = time.perf_counter()
        while not (cfg.max_steps is not None and r.steps >= cfg.max_steps) and r.left(self.t_save) > 0:
            if should_stop and should_stop():
                break
            ts = time.perf_counter()
            loss, rows = self._one_step(
                (self.elapsed_total + r.elapsed()) / total_budget if total_budget > 0 else 0.0, r.steps
            )
            r.add(loss, rows, time.perf_counter() - ts)
            now = time.perf_counter()
            if self.heldout and now - t_eval >= cfg.eval_every_s:
                r.last = self.evaluate()
                t_eval = time.perf_counter()
                self._record(r)
            if now - t_ckpt >= cfg.ckpt_every_s:
                self._save_at(r.elapsed())
                t_ckpt = time.perf_counter()
            report()

    def _end_cost(self, t_eval: float) -> float:
        """Seconds the run's end evaluations take, from the first's: held-out again, then the fit probe."""
        n_held = sum(s["len"] for s in self.heldout)
        probe = sum(s["len"] for s in self.fit_probe) / n_held if n_held else 0.0
        return t_eval * (1.0 + probe)

    def _end(self, r: RunClock, report: Callable[..., None]) -> TrainResult:
        """The run's last evaluation, record and checkpoint; its result."""
        if self.heldout:
            r.last = self.evaluate()
        self._record(r)
        secs = r.elapsed()
        self._save_at(secs)
        self.elapsed_total += secs
        fit = self.evaluate(self.fit_probe) if self.heldout else None  # only worth reading beside held-out
        report(final=True)
        self.head.eval()
        n_heldout = sum(s["len"] for s in self.heldout)
        return TrainResult(
            r.steps, secs, r.per_s(r.steps), r.per_s(r.rows), r.init, r.last, list(self.history), fit, n_heldout
        )

    def _record(self, r: RunClock, loss: bool = True) -> None:
        entry: dict[str, Any] = {
            "step": self.step,
            "elapsed_total": self.elapsed_total + (r.elapsed() if loss else 0.0),
        }
        if loss:
            entry["loss"] = r.losses[-1] if r.losses else None
        self.history.append({**entry, "heldout_top1": r.last[0], "heldout_top1_step2": r.last[1]})

    def _one_step(self, frac: float, steps_done: int) -> tuple[float, int]:
        """One optimiser step on a random batch at run fraction `frac`: (its loss, rows trained)."""
        cfg = self.cfg
        pick = self.rng.choice(len(self.train_seqs), size=min(cfg.batch_seqs, len(self.train_seqs)), replace=False)
        b = self.batcher.make([self.train_seqs[i] for i in sorted(pick)], cfg.prompt_weight)
        for g in self.opt.param_groups:
            g["lr"] = self._lr(frac)
        loss, rows = self.losses(b, unroll=cfg.unroll and self._progress(frac, steps_done) >= cfg.unroll_from)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self.step += 1
        return loss.item(), rows

    def _save_at(self, secs: float) -> None:
        before, t0 = self.elapsed_total, time.perf_counter()
        self.elapsed_total = before + secs
        try:
            self.save()
        finally:
            self.elapsed_total = before
            self.t_save = time.perf_counter() - t0  # (the last one: the end's checkpoint is reserved for)


__all__ = ["TrainConfig", "TrainProgress", "TrainResult", "Trainer", "Batcher", "LOSSES"]
