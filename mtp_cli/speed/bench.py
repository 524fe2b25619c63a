"""`mtp-cli bench`: none, ngram, lookup, mtp at fixed N, auto and adaptive side by side, in one run.

Same prompts and greedy decoding for every row; every setting runs `repeats` times, repeat by
repeat (measure.interleaved), and each row is the median repeat, with its ratio to plain decoding.
"auto" is what `mtp-cli generate` drafts with by default here (speed.auto.default_spec: the lookup
chained with the head, N from the tuned profile, else adaptive); "adaptive" is the head alone,
adaptive. Adaptive rows get a fresh controller per repeat, so each repeat pays its own learning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from mtp_cli.config import GenConfig, LoadConfig
from mtp_cli.errors import NoMtpHeadError
from mtp_cli.runtime import Runtime
from mtp_cli.speed.adaptive import ADAPTIVE_N_MAX, AdaptiveController
from mtp_cli.speed.auto import LOOKUP_N_MAX, AutoDraft, default_spec
from mtp_cli.speed.runs import (
    PROMPTS,
    RunResult,
    Setting,
    interleaved,
    prompt_tokens,
    setting_name,
    warm_up,
)
from mtp_cli.stats import GenStats

DEFAULT_NS = (1, 2, 3, 4)


@dataclass
class BenchRow:
    name: str
    detail: str  # how auto resolved, the N adaptive used...
    result: Optional[RunResult]  # None: not run (no MTP head)
    ratio: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "detail": self.detail,
            "ratio_vs_none": self.ratio,
            **(self.result.to_dict() if self.result else {"skipped": True}),
        }


@dataclass
class BenchResult:
    model: str
    threads: Optional[int]
    n_predict: int
    repeats: int
    prompts: int
    rows: list[BenchRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "threads": self.threads,
            "n_predict": self.n_predict,
            "repeats": self.repeats,
            "prompts": self.prompts,
            "rows": [r.to_dict() for r in self.rows],
        }


@dataclass
class BenchEvent:
    message: str
    done: int
    total: int


def _adaptive_detail(res: RunResult) -> str:
    s = res.extra.get("adaptive")
    if not s:
        return ""
    steps = s["steps_at"]
    tot = sum(steps) or 1
    used = ", ".join(f"N={n} {c / tot:.0%}" for n, c in enumerate(steps) if c)
    return f"steps at {used}; {s['probes']} probes, {s.get('shadow_probes', 0)} shadow"


def bench(
    model: str | Path,
    load: LoadConfig = LoadConfig(),
    *,
    prompts: Optional[Sequence[str]] = None,
    n_threads: Optional[int] = None,
    n_predict: int = 64,
    repeats: int = 3,
    n_values: Sequence[int] = DEFAULT_NS,
    ngram: bool = True,
    n_ctx: int = 2048,
    progress: Optional[Callable[[BenchEvent], None]] = None,
) -> BenchResult:
    """`load`: its draft model (an MTP sidecar), -ngl and placement (loaded for the MTP head, when
    the model has one)."""
    texts = list(prompts) if prompts is not None else list(PROMPTS)
    base = GenConfig(n_predict=n_predict, n_threads=n_threads, temp=0.0, n_ctx=n_ctx)
    try:
        rt = Runtime.load(model, load, spec_type="mtp")
        has_head = True
    except NoMtpHeadError:
        if load.draft_model is not None:
            raise
        rt = Runtime.load(model, load, spec_type="none")
        has_head = False
    out = BenchResult(str(model), n_threads, n_predict, repeats, len(texts))
    with rt:
        toks = prompt_tokens(rt, texts, prompts is None)
        details: dict[str, str] = {"none": "plain decoding"}
        settings = _settings(rt, base, default_spec(model, load.draft_model), n_values, ngram, has_head, details)
        total = len(settings) * max(1, repeats)
        done = [0]

        def on_run(name: str, r: int, st: GenStats) -> None:
            done[0] += 1
            if progress is not None:
                progress(BenchEvent(f"{name}: {st.tokens_per_second:.1f} tok/s (repeat {r + 1})", done[0], total))

        warm_up(rt, toks, base)  # on prompts that generate: the first row runs warm
        results = interleaved(rt, toks, settings, repeats, on_run=on_run)
        none_tps = results["none"].tokens_per_second
        for s in settings:
            res = results[s.name]
            det = details.get(s.name, "")
            extra = _adaptive_detail(res)
            det = "; ".join(x for x in (det, extra) if x)
            out.rows.append(BenchRow(s.name, det, res, _ratio(res.tokens_per_second, none_tps)))
        if not has_head:
            for name in [setting_name("mtp", n) for n in n_values] + ["adaptive"]:
                out.rows.append(BenchRow(name, "no MTP head", None))
    return out


def _settings(
    rt: Runtime, base: GenConfig, spec: str, n_values: Sequence[int], ngram: bool, head: bool, details: dict[str, str]
) -> list[Setting]:
    """The rows to measure: none, the lookups, the head at each N, auto (the default drafting `spec`),
    the head adaptive."""
    settings = [Setting("none", replace(base, spec_type="none"))]
    if ngram:
        settings.append(Setting(setting_name("ngram", 3), replace(base, spec_type="ngram", draft_n_max=3)))
        details[settings[-1].name] = "prompt lookup"
        settings.append(Setting("lookup", replace(base, spec_type="lookup", draft_n_max=LOOKUP_N_MAX)))
        details["lookup"] = "text lookup, its own length"
    if head:
        settings += [Setting(setting_name("mtp", n), replace(base, spec_type="mtp", draft_n_max=n)) for n in n_values]
    settings.append(_auto_setting(rt, replace(base, spec_type=spec), details))
    if head:
        mtp = replace(base, spec_type="mtp", draft_mode="adaptive", draft_n_max=ADAPTIVE_N_MAX)
        settings.append(Setting("adaptive", mtp, AdaptiveController))
        details["adaptive"] = "the head alone"
    return settings


def _auto_setting(rt: Runtime, cfg: GenConfig, details: dict[str, str]) -> Setting:
    """The default drafting under `auto`: the profile's setting, else adaptive (a fresh controller a repeat)."""
    r = AutoDraft(rt).resolve(replace(cfg, draft_mode="auto"), AdaptiveController())
    if r.controller is None:
        said = f"profile: {r.profile.setting}" if r.mode == "profile" and r.profile is not None else "no head"
        details["auto"] = f"{r.config.spec_type}; {said}"
        fixed = r.policy
        return Setting("auto", r.config, (lambda: fixed) if fixed is not None else None)
    details["auto"] = f"{r.config.spec_type}; no profile: adaptive"
    n_max = r.controller.n_max
    return Setting("auto", r.config, lambda: AdaptiveController(n_max))


def _ratio(tps: float, none_tps: float) -> float | None:
    """A speed ratio, or None where either side had no generation time (nothing after the prompt pass)."""
    return tps / none_tps if tps > 0 and none_tps > 0 else None


__all__ = ["bench", "BenchResult", "BenchRow", "BenchEvent", "DEFAULT_NS"]
