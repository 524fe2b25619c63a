"""`mtp-cli tune`: find the fastest draft setting for a model on this machine, within a time budget,
and remember it as a profile (mtp_cli.profiles) that `--spec-draft-n-max auto` uses.

Candidates: plain decoding ("off") and MTP at N = 1..n_max, each also with a couple of
--spec-draft-p-min values. All greedy, same prompts. The search:

1. the cost model (measure.measure_costs): T, v(N), c measured with llama_decode directly;
2. a screening pass: plain decoding, and MTP at N = n_max, whose acceptance-by-position curve
   predicts every N's speed ratio, E(N) (1 + o_plain) / (v(N) + N c + o(N)); settings predicted at
   under PRUNE_BELOW of the best prediction (or of plain decoding, whichever is higher) are not
   measured (the two best-predicted N always are, with their p-min variants);
3. successive halving: rungs of growing length (64, 128, 256... generated tokens per repeat), each
   candidate measured `repeats` times per rung, interleaved; after a rung, settings whose median
   tokens/s is below the best median by more than twice the run-to-run noise are dropped, and at
   most half go on. A rung starts only if its estimated time fits the remaining budget.
   Plain decoding runs in every rung: it is the baseline every ratio is measured against.

The winner is the best median in the last completed rung (it may be "off"). No click, no rich:
progress goes to a callback as TuneEvents.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from mtp_cli import profiles
from mtp_cli.measure import PROMPTS, CostModel, Setting, add_overheads, interleaved, measure_costs, run_setting
from mtp_cli.runtime import ConfigValueError, GenConfig, GenStats, Runtime

_now = time.perf_counter

DEFAULT_BUDGET = 60.0
DEFAULT_N_MAX = 8
DEFAULT_P_MINS = (0.5, 0.8)
PRUNE_BELOW = 0.8  # predicted ratio, relative to the best prediction (or 1.0)
RUNG0_TOKENS = 64  # generated tokens per candidate and repeat in the first rung (doubling)
CHUNK = 32  # tokens per prompt within a rung
MIN_NOISE = 0.01


class TuneError(ConfigValueError):
    """A tuning request that cannot run (budget too small, no prompts...)."""


@dataclass
class Candidate:
    name: str  # "off", "mtp N=3", "mtp N=3 p>=0.5"
    spec_type: str  # "none" or "mtp"
    n: int  # 0 for off
    p_min: float = 0.0
    predicted: Optional[float] = None  # predicted speed ratio vs plain decoding (p_min = 0 only)
    status: str = "pending"  # pending | measuring | kept | dropped | pruned | best | baseline
    rung: int = -1  # last rung it was measured in
    runs: list[float] = field(default_factory=list)  # tokens/s of each repeat in that rung
    acceptance: Optional[float] = None
    tokens_per_pass: Optional[float] = None
    ratio: Optional[float] = None  # median vs plain decoding's median in the same rung

    @property
    def tokens_per_second(self) -> Optional[float]:
        return statistics.median(self.runs) if self.runs else None

    def config(self, base: GenConfig) -> GenConfig:
        if self.spec_type == "none":
            return replace(base, spec_type="none")
        return replace(base, spec_type="mtp", draft_n_max=self.n, draft_p_min=self.p_min)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "spec_type": self.spec_type, "n": self.n, "p_min": self.p_min,
                "predicted_ratio": self.predicted, "status": self.status, "rung": self.rung,
                "tokens_per_second": self.tokens_per_second, "runs": list(self.runs), "ratio": self.ratio,
                "acceptance": self.acceptance, "tokens_per_pass": self.tokens_per_pass}


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
        return next((c for c in self.candidates if c.spec_type == "none"), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "budget_s": self.budget, "elapsed_s": self.elapsed, "rungs": self.rungs,
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


def _name(n: int, p_min: float) -> str:
    return "off" if n == 0 else f"mtp N={n}" + (f" p>={p_min:g}" if p_min > 0 else "")


def _jobs(prompts: Sequence[list[int]], tokens: int, start: int = 0) -> tuple[list[list[int]], int]:
    """Prompts (cyclically from `start`) and the n_predict per prompt so a pass generates ~`tokens`."""
    n = max(1, math.ceil(tokens / CHUNK))
    picked = [prompts[(start + i) % len(prompts)] for i in range(n)]
    return picked, max(1, min(CHUNK, tokens))


def tune(model: str | Path, draft: Optional[str | Path] = None, *, prompts: Optional[Sequence[str]] = None,
         budget: float = DEFAULT_BUDGET, n_threads: Optional[int] = None, n_gpu_layers: int = -1,
         n_max: int = DEFAULT_N_MAX, p_mins: Sequence[float] = DEFAULT_P_MINS, repeats: int = 3, n_ctx: int = 2048,
         progress: Optional[Callable[[TuneEvent], None]] = None, save: bool = True,
         config_dir: Optional[Path] = None) -> TuneResult:
    """Measure, pick the fastest setting, save it as this model's profile on this machine (save=True)."""
    t0 = _now()
    if budget <= 0:
        raise TuneError(f"--budget must be positive, got {budget:g}")
    if not 1 <= n_max <= 16:
        raise TuneError(f"--n-max must be in 1..16, got {n_max}")
    texts = list(prompts) if prompts is not None else list(PROMPTS)
    if not texts:
        raise TuneError("no prompts")
    deadline = t0 + budget
    res = TuneResult(model=str(model), budget=budget)

    def emit(kind: str, msg: str) -> None:
        res.elapsed = _now() - t0
        res.stage = kind
        if progress is not None:
            progress(TuneEvent(kind, msg, res))

    base = GenConfig(n_threads=n_threads, n_gpu_layers=n_gpu_layers, temp=0.0, n_ctx=n_ctx, n_predict=CHUNK)
    with Runtime(model, spec_type="mtp", draft_model=draft, n_gpu_layers=n_gpu_layers) as rt:
        toks = [rt.tokenize(t) for t in texts]
        if max(len(t) for t in toks) + RUNG0_TOKENS >= n_ctx:
            raise TuneError(f"a prompt is too long for the tuning context ({n_ctx} tokens)")
        ident = profiles.identify(model, draft, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        off = Candidate("off", "none", 0, status="baseline")
        res.candidates = [off]
        emit("start", "warming up")
        # warm-up (page faults, threads), and a first estimate of the plain per-token time
        warm = run_setting(rt, toks[:1], replace(base, spec_type="none", n_predict=16))
        t_tok = warm.t_gen / max(warm.n_tokens, 1)

        # 1. the cost model -----------------------------------------------------------------------
        emit("costs", "measuring decode costs (T, v(N), c)")
        reps, rounds = 4, 3
        # v(N) <= N+1 in practice; after each verify at N the head decodes N times (c < 0.3 T)
        per_sample = ((n_max + 1) * (n_max + 2) / 2 + 2 + 0.3 * n_max * (n_max + 1) / 2) * t_tok
        est = rounds * (reps + 1) * per_sample
        while est > 0.15 * budget and (reps > 1 or rounds > 1):
            if reps > 1:
                reps -= 1
            else:
                rounds -= 1
            est = rounds * (reps + 1) * per_sample
        cm_prompt = (toks[0] + toks[1 % len(toks)])[: n_ctx // 4]
        cm = measure_costs(rt, base, n_max, cm_prompt, rounds=rounds, reps=reps)
        res.cost = cm
        emit("costs", f"T = {cm.t_ms:.3g} ms")

        # 2. screening: plain, and MTP at n_max (the acceptance curve) --------------------------------
        step_s = cm.t_ms / 1e3 * (cm.step_cost(n_max) + 0.2)
        screen_tokens = int(max(16, min(RUNG0_TOKENS, 0.1 * budget / max(step_s, 1e-9))))
        jobs, npred = _jobs(toks, screen_tokens)
        emit("screen", f"screening: plain and mtp N={n_max}, {screen_tokens} tokens")
        s_plain = run_setting(rt, jobs, replace(base, spec_type="none", n_predict=npred))
        s_top = run_setting(rt, jobs, replace(base, spec_type="mtp", draft_n_max=n_max, n_predict=npred))
        add_overheads(cm, {n_max: s_top}, s_plain)
        curve = s_top.acceptance_by_pos
        res.acceptance_by_pos = curve
        preds = {n: cm.ratio(n, curve) for n in range(1, n_max + 1)}
        best_pred = max(max(preds.values()), 1.0)
        top2 = sorted(preds, key=lambda n: -preds[n])[:2]
        for n in range(1, n_max + 1):
            keep = preds[n] >= PRUNE_BELOW * best_pred or n in top2
            res.candidates.append(Candidate(_name(n, 0.0), "mtp", n, 0.0, preds[n], "pending" if keep else "pruned"))
            if n in top2:
                for p in p_mins:
                    if p > 0:
                        res.candidates.append(Candidate(_name(n, p), "mtp", n, float(p), None, "pending"))
        emit("screen", f"predicted best: {_name(top2[0], 0)} at {preds[top2[0]]:.2f}x plain")

        # 3. successive halving --------------------------------------------------------------------
        alive = [c for c in res.candidates if c.status in ("pending", "baseline")]
        rung = 0
        tokens = RUNG0_TOKENS
        sec_per_tok: dict[str, float] = {c.name: t_tok / (c.predicted or 0.8) for c in alive}
        sec_per_tok["off"] = cm.t_ms / 1e3 * cm.plain_cost
        n_rep = max(1, repeats)
        wall_factor = 1.3  # rung wall time / generation time (prompts, contexts...), measured after each rung
        plain_stats: GenStats = s_plain
        mtp_stats: dict[int, GenStats] = {n_max: s_top}
        while True:
            remaining = deadline - _now()
            est = sum(sec_per_tok[c.name] for c in alive) * tokens * n_rep * wall_factor * 1.1
            if est > remaining:
                if rung == 0:  # the first rung must run: shrink it to fit
                    scale = remaining / max(est, 1e-9)
                    if scale * tokens * n_rep < 16:
                        n_rep = 1
                    tokens = int(max(16, min(tokens, tokens * scale * repeats / n_rep)))
                else:
                    break
            jobs, npred = _jobs(toks, tokens, start=rung)
            settings = [Setting(c.name, c.config(replace(base, n_predict=npred))) for c in alive]
            for c in alive:
                if c.status != "baseline":
                    c.status = "measuring"
            emit("rung", f"rung {rung + 1}: {len(alive)} settings x {n_rep} repeats x {tokens} tokens")

            t_rung = _now()
            gen_s = [0.0]

            def on_run(name: str, r: int, st: GenStats) -> None:
                gen_s[0] += st.t_gen
                emit("measure", f"rung {rung + 1}, repeat {r + 1}: {name} {st.tokens_per_second:.1f} tok/s")

            out = interleaved(rt, jobs, settings, n_rep, on_run=on_run,
                              deadline=deadline if rung == 0 else None)
            if gen_s[0] > 0:
                wall_factor = max(1.0, (_now() - t_rung) / gen_s[0])
            for c in alive:
                r = out[c.name]
                if c.spec_type == "none":
                    plain_stats = r.stats
                elif c.p_min == 0.0:
                    mtp_stats[c.n] = r.stats
                c.runs = list(r.runs)
                c.rung = rung
                c.acceptance = r.stats.acceptance if c.spec_type == "mtp" else None
                c.tokens_per_pass = r.stats.tokens_per_pass if c.spec_type == "mtp" else None
                sec_per_tok[c.name] = 1.0 / max(r.tokens_per_second, 1e-9)
            base_tps = off.tokens_per_second or 0.0
            for c in alive:
                c.ratio = (c.tokens_per_second or 0.0) / base_tps if base_tps else None
            res.rungs = rung + 1
            # drop clear losers; at most half go on (plain decoding always stays as the baseline)
            ranked = sorted(alive, key=lambda c: -(c.tokens_per_second or 0.0))
            top = ranked[0].tokens_per_second or 0.0
            noise = max(MIN_NOISE, statistics.median([_spread(c.runs) for c in alive]))
            survivors = [c for c in ranked if (c.tokens_per_second or 0.0) >= top * (1 - 2 * noise)]
            survivors = survivors[: max(2, math.ceil(len(alive) / 2))]
            for c in alive:
                if c is not off:
                    c.status = "kept" if c in survivors else "dropped"
            emit("rung", f"rung {rung + 1} done: best {ranked[0].name} {top:.1f} tok/s, noise {noise:.1%}")
            if len(survivors) == 1:  # a clear winner
                break
            alive = survivors if off in survivors else survivors + [off]
            rung += 1
            tokens *= 2

        last = [c for c in res.candidates if c.rung == res.rungs - 1]
        best = max(last, key=lambda c: c.tokens_per_second or 0.0)
        best.status = "best"
        res.best = best

        # 4. the profile (the cost model's overheads from the longest runs of each N) -----------------
        add_overheads(cm, mtp_stats, plain_stats)
        base_tps = off.tokens_per_second or 0.0
        prof = profiles.Profile(
            key=ident.key, model=ident.model, draft=ident.draft, machine=ident.machine,
            spec_type=best.spec_type, draft_n_max=max(best.n, 1), draft_p_min=best.p_min,
            tokens_per_second=best.tokens_per_second or 0.0,
            ratio_vs_none=(best.tokens_per_second or 0.0) / base_tps if base_tps else 1.0,
            cost_model=cm.to_dict(), acceptance_by_pos=list(curve),
            settings=[c.to_dict() for c in res.candidates],
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        res.profile = prof
        if save:
            res.profile_path = profiles.save(prof, config_dir)
    emit("done", f"best: {best.name}")
    return res


def _spread(runs: Sequence[float]) -> float:
    if len(runs) < 2:
        return 0.0
    m = statistics.median(runs)
    return (max(runs) - min(runs)) / m if m > 0 else 0.0


__all__ = ["tune", "TuneResult", "TuneEvent", "Candidate", "TuneError", "DEFAULT_BUDGET", "DEFAULT_N_MAX",
           "DEFAULT_P_MINS"]
