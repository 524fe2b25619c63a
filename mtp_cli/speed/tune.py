"""`mtp-cli tune`: find the fastest draft setting for a model on this machine, within a time budget,
and remember it as a profile (mtp_cli.speed.profiles) that the `auto` draft length uses.

Candidates: plain decoding ("off"), MTP at N = 1..n_max, each also with a couple of draft_p_min
values, the text lookup alone (it sizes its own drafts) and the lookup chained before the head at
the two best-predicted N (what the default drafting runs). All greedy, same prompts. The search:

1. the cost model (mtp_cli.speed.probe): T, v(N), c measured with llama_decode directly;
2. a screening pass: plain decoding, and MTP at N = n_max, whose acceptance-by-position curve
   predicts every N's speed ratio, E(N) (1 + o_plain) / (v(N) + N c + o(N)); settings predicted at
   under PRUNE_BELOW of the best prediction (or of plain decoding, whichever is higher) are not
   measured (the two best-predicted N always are, with their p-min variants);
3. successive halving: rungs of growing length (64, 128, 256... generated tokens per repeat), each
   candidate measured `repeats` times per rung, interleaved; after a rung, settings whose median
   tokens/s is below the best median by more than twice the run-to-run noise are dropped, and at
   most half go on. A rung starts only if its estimated time fits the remaining budget; a first
   rung that does not fit loses its p-min variants, then its slowest-predicted settings (down to
   two), before it is shortened.
   Plain decoding runs in every rung: it is the baseline every ratio is measured against.

The winner is the best median in the last completed rung (it may be "off"): the profile holds the
head's setting (its N, or off) and whether it was measured beside the lookup. No click, no rich:
progress goes to a callback as TuneEvents.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from mtp_cli.config import GenConfig, LoadConfig
from mtp_cli.errors import MeasureError, TuneError
from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.auto import lookup_cap
from mtp_cli.speed.candidates import CHAIN, Candidate, as_setting
from mtp_cli.speed.costs import CostModel, add_overheads
from mtp_cli.speed.probe import measure_costs
from mtp_cli.speed.runs import (
    PROMPTS,
    interleaved,
    prompt_tokens,
    run_setting,
    setting_name,
    spread,
    warm_up,
)
from mtp_cli.stats import GenStats

_now = time.perf_counter

DEFAULT_BUDGET = 60.0
DEFAULT_N_MAX = 8
DEFAULT_P_MINS = (0.5, 0.8)
PRUNE_BELOW = 0.8  # predicted ratio, relative to the best prediction (or 1.0)
RUNG0_TOKENS = 64  # generated tokens per candidate and repeat in the first rung (doubling)
CHUNK = 32  # tokens per prompt within a rung
MIN_NOISE = 0.01


@dataclass
class TuneResult:
    model: str
    budget: float
    candidates: list[Candidate] = field(default_factory=list)
    cost: Optional[CostModel] = None
    acceptance_by_pos: list[float] = field(default_factory=list)  # screening curve at N = n_max
    best: Optional[Candidate] = None
    rungs: int = 0
    elapsed: float = 0.0
    profile: Optional[profiles.Profile] = None
    profile_path: Optional[Path] = None
    stage: str = "start"

    @property
    def baseline(self) -> Optional[Candidate]:
        return next((c for c in self.candidates if c.off), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "budget_s": self.budget,
            "elapsed_s": self.elapsed,
            "rungs": self.rungs,
            "best": self.best.to_dict() if self.best else None,
            "settings": [c.to_dict() for c in self.candidates],
            "cost_model": self.cost.to_dict() if self.cost else None,
            "acceptance_by_pos": self.acceptance_by_pos,
            "profile_key": self.profile.key if self.profile else None,
            "profile_path": str(self.profile_path) if self.profile_path else None,
        }


@dataclass
class TuneEvent:
    kind: str  # start | costs | screen | measure | rung | done
    message: str
    result: TuneResult


def _jobs(prompts: Sequence[list[int]], tokens: int, start: int = 0) -> tuple[list[list[int]], int]:
    """Prompts (cyclically from `start`) and the n_predict per prompt so a pass generates ~`tokens`."""
    n = max(1, math.ceil(tokens / CHUNK))
    picked = [prompts[(start + i) % len(prompts)] for i in range(n)]
    return picked, max(1, min(CHUNK, tokens))


def tune(
    model: str | Path,
    load: LoadConfig = LoadConfig(),
    *,
    prompts: Optional[Sequence[str]] = None,
    budget: float = DEFAULT_BUDGET,
    n_threads: Optional[int] = None,
    n_max: int = DEFAULT_N_MAX,
    p_mins: Sequence[float] = DEFAULT_P_MINS,
    repeats: int = 3,
    n_ctx: int = 2048,
    progress: Optional[Callable[[TuneEvent], None]] = None,
    save: bool = True,
    config_dir: Optional[Path] = None,
    flash_attn: Optional[bool] = None,
) -> TuneResult:
    """Measure, pick the fastest setting, save it as this model's profile on this machine (save=True).
    `load`: its draft model (an MTP sidecar), -ngl and placement (loaded for the MTP head);
    `flash_attn`: -fa (None: auto; the profile is keyed by what it resolves to)."""
    t0 = _now()
    if budget <= 0:
        raise TuneError(f"`budget` must be positive, got {budget:g}")
    if not 1 <= n_max <= 16:
        raise TuneError(f"`n_max` must be in 1..16, got {n_max}")
    texts = list(prompts) if prompts is not None else list(PROMPTS)
    if not texts:
        raise TuneError("no prompts")
    builtin = prompts is None
    base = GenConfig(n_threads=n_threads, temp=0.0, n_ctx=n_ctx, n_predict=CHUNK, flash_attn=flash_attn)
    with Runtime.load(model, load, spec_type="mtp") as rt:
        toks = prompt_tokens(rt, texts, builtin)
        if max(len(t) for t in toks) + RUNG0_TOKENS >= n_ctx:
            raise TuneError(f"a prompt is too long for the tuning context ({n_ctx} tokens)")
        tuner = _Tuner(rt, base, toks, TuneResult(model=str(model), budget=budget), t0, progress)
        t_tok = tuner.warm_up()
        cm = tuner.costs(n_max, t_tok)
        screened = tuner.screen(cm, n_max, p_mins)
        plain, by_n = tuner.halving(cm, t_tok, repeats, screened)
        tuner.choose(cm, plain, by_n, save, config_dir)
    tuner.emit("done", f"best: {tuner.res.best.name if tuner.res.best else '-'}")
    return tuner.res


class _Tuner:
    """The stages of one tune, sharing the runtime, the prompts and the result they fill."""

    def __init__(
        self,
        rt: Runtime,
        base: GenConfig,
        toks: list[list[int]],
        res: TuneResult,
        t0: float,
        progress: Optional[Callable[[TuneEvent], None]],
    ):
        self.rt, self.base, self.toks, self.res, self.t0, self.progress = rt, base, toks, res, t0, progress
        self.deadline = t0 + res.budget
        self.off = Candidate("off", "none", 0, status="baseline")
        # the profile's key first: a file that cannot be read fails before the budget is spent
        self.ident = profiles.identify(
            rt.file,
            rt.draft_file,
            n_threads=base.n_threads,
            n_gpu_layers=rt.config.n_gpu_layers,
            placement=rt.config.placement,
            flash_attn=rt.flash_attn(base),
        )
        res.candidates = [self.off]

    def emit(self, kind: str, msg: str) -> None:
        self.res.elapsed = _now() - self.t0
        self.res.stage = kind
        if self.progress is not None:
            self.progress(TuneEvent(kind, msg, self.res))

    def warm_up(self) -> float:
        """Page faults, threads; a first estimate of the plain per-token time (from tokens that were
        generated: an empty warm-up once made a "20 s" tune run 212 s)."""
        self.emit("start", "warming up")
        return warm_up(self.rt, self.toks, self.base)

    def costs(self, n_max: int, t_tok: float) -> CostModel:
        """1. The cost model, in rounds and repeats that fit 15% of the budget."""
        self.emit("costs", "measuring decode costs (T, v(N), c)")
        reps, rounds = 4, 3
        # v(N) <= N+1 in practice; after each verify at N the head decodes N times (c < 0.3 T)
        per_sample = ((n_max + 1) * (n_max + 2) / 2 + 2 + 0.3 * n_max * (n_max + 1) / 2) * t_tok
        while rounds * (reps + 1) * per_sample > 0.15 * self.res.budget and (reps > 1 or rounds > 1):
            if reps > 1:
                reps -= 1
            else:
                rounds -= 1
        toks = self.toks
        cm_prompt = (toks[0] + toks[1 % len(toks)])[: self.base.n_ctx // 4]
        cm = measure_costs(self.rt, self.base, n_max, cm_prompt, rounds=rounds, reps=reps)
        self.res.cost = cm
        self.emit("costs", f"T = {cm.t_ms:.3g} ms")
        return cm

    def screen(self, cm: CostModel, n_max: int, p_mins: Sequence[float]) -> tuple[GenStats, GenStats]:
        """2. Plain decoding and MTP at n_max: the acceptance curve predicts every N; the candidates."""
        step_s = cm.t_ms / 1e3 * (cm.step_cost(n_max) + 0.2)
        screen_tokens = int(max(16, min(RUNG0_TOKENS, 0.1 * self.res.budget / max(step_s, 1e-9))))
        jobs, npred = _jobs(self.toks, screen_tokens)
        self.emit("screen", f"screening: plain and mtp N={n_max}, {screen_tokens} tokens")
        s_plain = run_setting(self.rt, jobs, replace(self.base, spec_type="none", n_predict=npred))
        s_top = run_setting(self.rt, jobs, replace(self.base, spec_type="mtp", draft_n_max=n_max, n_predict=npred))
        add_overheads(cm, {n_max: s_top}, s_plain)
        curve = self.res.acceptance_by_pos = s_top.acceptance_by_pos
        preds = {n: cm.ratio(n, curve) for n in range(1, n_max + 1)}
        best_pred = max(max(preds.values()), 1.0)
        top2 = sorted(preds, key=lambda n: -preds[n])[:2]
        for n in range(1, n_max + 1):
            keep = preds[n] >= PRUNE_BELOW * best_pred or n in top2
            self.res.candidates.append(
                Candidate(setting_name("mtp", n), "mtp", n, 0.0, preds[n], "pending" if keep else "pruned")
            )
            if n in top2:
                self.res.candidates += [
                    Candidate(setting_name("mtp", n, p), "mtp", n, float(p), None, "pending") for p in p_mins if p > 0
                ]
        lookups = [Candidate("lookup", "lookup", 0, 0.0, None, "pending")]
        lookups += [Candidate(setting_name(CHAIN, n), CHAIN, n, 0.0, preds[n], "pending") for n in top2]
        self.res.candidates += lookups
        self.emit("screen", f"predicted best: {setting_name('mtp', top2[0])} at {preds[top2[0]]:.2f}x plain")
        return s_plain, s_top

    def halving(
        self, cm: CostModel, t_tok: float, repeats: int, screened: tuple[GenStats, GenStats]
    ) -> tuple[GenStats, dict[int, GenStats]]:
        """3. Successive halving; (plain decoding's stats, MTP's by N) from the longest runs of each."""
        plain, by_n = screened[0], {cm.n_max: screened[1]}
        alive = [c for c in self.res.candidates if c.status in ("pending", "baseline")]
        sec_per_tok = {c.name: t_tok / (c.predicted or (1.0 if c.lookup_alone else 0.8)) for c in alive}
        sec_per_tok["off"] = cm.t_ms / 1e3 * cm.plain_cost
        rung, tokens, n_rep = 0, RUNG0_TOKENS, max(1, repeats)
        wall_factor = 1.3  # rung wall time / generation time (prompts, contexts...), measured after each rung
        while True:
            est = sum(sec_per_tok[c.name] for c in alive) * tokens * n_rep * wall_factor * 1.1
            remaining = self.deadline - _now()
            if est > remaining:
                if rung:
                    break
                if self._drop_least_promising(alive):  # a rung too short to tell settings apart is worse
                    continue
                # the first rung must run: shrink it to fit
                scale = remaining / max(est, 1e-9)
                n_rep = 1 if scale * tokens * n_rep < 16 else n_rep
                tokens = int(max(16, min(tokens, tokens * scale * repeats / n_rep)))
            out, wall_factor = self._rung(alive, rung, tokens, n_rep, wall_factor)
            for c in alive:
                r = out[c.name]
                if c.off:
                    plain = r.stats
                elif c.p_min == 0.0 and c.head_alone:
                    by_n[c.n] = r.stats
                c.record(rung, r.runs, r.stats)
                sec_per_tok[c.name] = 1.0 / max(r.tokens_per_second, 1e-9)
            survivors = self._cut(alive, rung)
            if len(survivors) == 1:  # a clear winner
                break
            alive = survivors if self.off in survivors else survivors + [self.off]
            rung += 1
            tokens *= 2
        return plain, by_n

    def _drop_least_promising(self, alive: list[Candidate]) -> bool:
        """Prune a p-min variant, else the slowest-predicted setting, while more than off and two are left."""
        rest = [c for c in alive if c is not self.off]
        if len(rest) <= 2:
            return False
        worst = min(rest, key=lambda c: (c.p_min == 0.0, c.lookup_alone, c.predicted or 0.0, -c.n))
        worst.status = "pruned"
        alive.remove(worst)
        return True

    def _rung(self, alive: list[Candidate], rung: int, tokens: int, n_rep: int, wall_factor: float):
        """One rung: every live setting n_rep times, interleaved; the results and the new wall factor."""
        jobs, npred = _jobs(self.toks, tokens, start=rung)
        cap = lookup_cap(self.rt.recurrent)
        settings = [as_setting(c, replace(self.base, n_predict=npred), cap) for c in alive]
        for c in alive:
            if c.status != "baseline":
                c.status = "measuring"
        self.emit("rung", f"rung {rung + 1}: {len(alive)} settings x {n_rep} repeats x {tokens} tokens")
        t_rung, gen_s = _now(), [0.0]

        def on_run(name: str, r: int, st: GenStats) -> None:
            gen_s[0] += st.t_gen
            self.emit("measure", f"rung {rung + 1}, repeat {r + 1}: {name} {st.tokens_per_second:.1f} tok/s")

        out = interleaved(self.rt, jobs, settings, n_rep, on_run=on_run, deadline=self.deadline if rung == 0 else None)
        if gen_s[0] > 0:
            wall_factor = max(1.0, (_now() - t_rung) / gen_s[0])
        return out, wall_factor

    def _cut(self, alive: list[Candidate], rung: int) -> list[Candidate]:
        """Ratios against plain decoding; clear losers dropped, at most half go on."""
        base_tps = self.off.tokens_per_second or 0.0
        for c in alive:
            c.ratio = (c.tokens_per_second or 0.0) / base_tps if base_tps else None
        self.res.rungs = rung + 1
        ranked = sorted(alive, key=lambda c: -(c.tokens_per_second or 0.0))
        top = ranked[0].tokens_per_second or 0.0
        noise = max(MIN_NOISE, statistics.median([spread(c.runs) for c in alive]))
        survivors = [c for c in ranked if (c.tokens_per_second or 0.0) >= top * (1 - 2 * noise)]
        survivors = survivors[: max(2, math.ceil(len(alive) / 2))]
        for c in alive:
            if c is not self.off:  # (plain decoding always stays as the baseline)
                c.status = "kept" if c in survivors else "dropped"
        self.emit("rung", f"rung {rung + 1} done: best {ranked[0].name} {top:.1f} tok/s, noise {noise:.1%}")
        return survivors

    def _pick(self, last: list[Candidate]) -> Candidate:
        """The fastest of the last rung, except that off, then the lookup alone, then fewer drafts (the
        lookup beside them before the head alone), wins over anything not faster by more than the
        repeats' spread; a setting that never kept a draft never wins."""
        if not (self.off.tokens_per_second or 0.0) > 0:
            raise MeasureError("could not measure plain decoding (no tokens after the prompt pass); nothing saved")
        useful = [c for c in last if c.off or (c.acceptance or 0.0) > 0]
        top = max(c.tokens_per_second or 0.0 for c in useful)
        noise = max(MIN_NOISE, statistics.median([spread(c.runs) for c in useful]))
        near = [c for c in useful if (c.tokens_per_second or 0.0) >= top * (1 - noise)]
        return min(near, key=lambda c: (not c.off, c.n, c.p_min, not c.lookup, -(c.tokens_per_second or 0.0)))

    def choose(
        self, cm: CostModel, plain: GenStats, by_n: dict[int, GenStats], save: bool, config_dir: Optional[Path]
    ) -> None:
        """4. The best median of the last rung, and its profile (the cost model's overheads from the
        longest runs of each N)."""
        res = self.res
        best = self._pick([c for c in res.candidates if c.rung == res.rungs - 1])
        best.status = "best"
        res.best = best
        add_overheads(cm, by_n, plain)
        base_tps = self.off.tokens_per_second or 0.0
        ident = self.ident
        res.profile = profiles.Profile(
            key=ident.key,
            model=ident.model,
            draft=ident.draft,
            machine=ident.machine,
            spec_type=best.spec_type,
            draft_n_max=max(best.n, 1),
            draft_p_min=best.p_min,
            tokens_per_second=best.tokens_per_second or 0.0,
            ratio_vs_none=(best.tokens_per_second or 0.0) / base_tps if base_tps else 1.0,
            cost_model=cm.to_dict(),
            acceptance_by_pos=list(res.acceptance_by_pos),
            settings=[c.to_dict() for c in res.candidates],
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        if save:
            res.profile_path = profiles.save(res.profile, config_dir)


__all__ = [
    "tune",
    "TuneResult",
    "TuneEvent",
    "Candidate",
    "TuneError",
    "DEFAULT_BUDGET",
    "DEFAULT_N_MAX",
    "DEFAULT_P_MINS",
]
