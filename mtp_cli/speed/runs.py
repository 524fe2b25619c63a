"""Measuring draft settings: a pass over the prompts, repeats interleaved, the median repeat.

Shared by `tune`, `bench` and benchmarks/spec_bench.py. A pass pools its generations' GenStats
(tokens / generation seconds, so long and short prompts weigh by their tokens); settings are run
repeat by repeat, the order rotated each repeat, so slow drift in the machine's speed hits every
setting alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from mtp_cli import drafters
from mtp_cli.chat import chat_prompt
from mtp_cli.config import GenConfig
from mtp_cli.errors import MeasureError
from mtp_cli.policy import DraftPolicy
from mtp_cli.runtime import Runtime
from mtp_cli.stats import GenStats

_now = time.perf_counter

PROMPTS = [
    "Write a short email to a colleague asking to move our meeting to Thursday.",
    "Give me a simple recipe for pancakes.",
    "Tell a short story about a lighthouse keeper.",
    "How do I change a flat tire on a bicycle?",
    "Explain why the sky is blue.",
    "List five tips for better sleep.",
]

PolicyFactory = Callable[[], DraftPolicy]


WARM_TOKENS = 16  # tokens after the prompt pass a warm-up must see before anything is timed


def prompt_tokens(rt: Runtime, texts: Sequence[str], builtin: bool) -> list[list[int]]:
    """The prompts as tokens; the built-in ones wrapped in the model's chat template when it has one
    (an instruct model given a bare request often ends its text at once: nothing to measure)."""
    if builtin and isinstance(rt.chat_file.get("tokenizer.chat_template"), str):
        specials = rt.special_texts()
        return [rt.tokenize(chat_prompt(rt.chat_file, t, *specials), parse_special=True) for t in texts]
    return [rt.tokenize(t) for t in texts]


def warm_up(rt: Runtime, toks: Sequence[list[int]], base: GenConfig) -> float:
    """Plain decoding over the prompts until WARM_TOKENS tokens came after a prompt pass (page faults,
    threads, caches); seconds per token. Raises MeasureError if the prompts end at once."""
    n = t = 0.0
    for prompt in toks:
        st = run_setting(rt, [prompt], replace(base, spec_type="none", n_predict=WARM_TOKENS + 1))
        n, t = n + st.n_tokens - st.n_first, t + st.t_gen
        if n >= WARM_TOKENS:
            return t / n
    if n == 0:
        raise MeasureError(
            "nothing to measure: the model ends its text right after every prompt "
            "(give prompts it continues, `prompts`)"
        )
    return t / n


def setting_name(spec_type: str, n: int = 0, p_min: float = 0.0) -> str:
    """ "off", "ngram N=3", "mtp N=3", "mtp N=3 p>=0.5", "lookup" (it sizes its own drafts), "lookup,mtp
    N=3": how a setting is named everywhere."""
    cls = drafters.get(spec_type)
    if not cls.drafts:
        return "off"
    if all(m.self_sized for m in drafters.members(cls)):
        return cls.name
    if n == 0:
        return "off"
    return f"{cls.name} N={n}" + (f" p>={p_min:g}" if p_min > 0 else "")


def spread(runs: Sequence[float]) -> float:
    """(max - min) / median of the repeats: the run-to-run noise."""
    if len(runs) < 2:
        return 0.0
    m = statistics.median(runs)
    return (max(runs) - min(runs)) / m if m > 0 else 0.0


@dataclass
class RunResult:
    """One setting's measurement: the pooled stats of the median repeat, and every repeat's tokens/s."""

    stats: GenStats
    runs: list[float] = field(default_factory=list)  # tokens/s of each repeat
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the adaptive controller's summary

    @classmethod
    def median_of(cls, passes: Sequence[GenStats]) -> RunResult:
        ranked = sorted(passes, key=lambda x: x.tokens_per_second)
        return cls(ranked[len(ranked) // 2], [x.tokens_per_second for x in passes])

    @property
    def tokens_per_second(self) -> float:
        return self.stats.tokens_per_second

    @property
    def spread(self) -> float:
        return spread(self.runs)

    def to_dict(self) -> dict[str, Any]:
        s = self.stats
        steps = max(s.n_verify, 1)
        return {
            "tokens_per_second": s.tokens_per_second,
            "tokens_per_second_runs": list(self.runs),
            "tokens": s.n_tokens,
            "verify_passes": s.n_verify,
            "acceptance": s.acceptance,
            "acceptance_by_pos": s.acceptance_by_pos,
            "mean_accepted_per_pass": s.mean_accepted_per_pass,
            "tokens_per_pass": s.tokens_per_pass,
            "target_decode_ms_per_step": 1e3 * s.t_target_decode / steps,
            "draft_decode_ms_per_step": 1e3 * s.t_draft_decode / steps,
            "python_overhead_ms_per_step": 1e3 * s.t_overhead / steps,
            **self.extra,
        }


def run_setting(
    rt: Runtime, prompts: Sequence[Sequence[int]], cfg: GenConfig, *, policy: Optional[DraftPolicy] = None
) -> GenStats:
    """One pass over all prompts (one policy, if given, for the whole pass); pooled stats."""
    out = []
    for toks in prompts:
        gen = rt.generate(toks, cfg, policy=policy)
        for _ in gen:
            pass
        out.append(gen.stats)
    return GenStats.pooled(out, None if out else drafters.get(cfg.spec_type).name)


@dataclass
class Setting:
    """A named configuration to measure; a setting with a policy factory gets a fresh policy (e.g.
    an AdaptiveController) for every repeat, so each repeat pays its own learning."""

    name: str
    config: GenConfig
    policy_factory: Optional[PolicyFactory] = None


def interleaved(
    rt: Runtime,
    prompts: Sequence[Sequence[int]],
    settings: Sequence[Setting],
    repeats: int,
    *,
    on_run: Optional[Callable[[str, int, GenStats], None]] = None,
    deadline: Optional[float] = None,
) -> dict[str, RunResult]:
    """Every setting `repeats` times, repeat by repeat (the order rotated each repeat); the median
    repeat of each. With a deadline (a time.perf_counter() value) the remaining repeats are skipped
    once it has passed (at least one repeat always runs)."""
    passes: dict[str, list[GenStats]] = {s.name: [] for s in settings}
    summaries: dict[str, Any] = {}
    order = list(settings)
    for r in range(max(1, repeats)):
        if r and deadline is not None and _now() > deadline:
            break
        k = r % len(order) if order else 0
        for s in order[k:] + order[:k]:
            policy = s.policy_factory() if s.policy_factory else None
            st = run_setting(rt, prompts, s.config, policy=policy)
            passes[s.name].append(st)
            if hasattr(policy, "summary"):
                summaries[s.name] = policy.summary()  # type: ignore[union-attr]
            if on_run is not None:
                on_run(s.name, r, st)
    out = {}
    for s in settings:
        res = RunResult.median_of(passes[s.name])
        if s.name in summaries:
            res.extra["adaptive"] = summaries[s.name]
        out[s.name] = res
    return out


__all__ = ["PROMPTS", "PolicyFactory", "setting_name", "spread", "RunResult", "run_setting", "Setting", "interleaved"]
