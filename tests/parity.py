"""Parity helpers for the runtime and drafter tests (ARCHITECTURE §3).

Greedy speculative output must equal plain greedy output token for token. Batched verification
changes logits by ~1e-3 against one-token decoding, so a divergence is tolerated only at a position
whose baseline top-2 logit gap is below TIE_EPS; such ties are counted and reported separately
(SUMMARY, printed with -s, and record_property). Any other divergence fails the test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig
from mtp_cli.memory import common_prefix
from mtp_cli.policy import DraftPolicy
from mtp_cli.runtime import Runtime

# One thread: ggml's worker threads spin-wait at every barrier, and on this 2-core machine with
# other jobs running, 2-thread decoding of these tiny graphs degraded from ~7 s to 100-500 s for
# this file (spinning, not work). Results do not depend on the thread count.
THREADS = 1


ARCHS = ("qwen35", "glm4moe")


NS = range(1, 7)


TIE_EPS = 1e-2  # top-2 logit gap (baseline) under which a greedy divergence is a tie, not a bug


N_GEN = 40


PROMPT = "hello world"


SUMMARY: list[str] = []


# Parity needs a target whose tokens depend on its context (KV and recurrent state), or a wrong
# rollback could go unnoticed: with the factory's default trunk_mix (0.02) the structured model's
# greedy successor is P(x) whatever came before. trunk_mix=2 makes ~1/4 of the greedy tokens
# context-dependent while the head (which predicts P(x)) is still accepted about half the time.
SENSITIVE = dict(trunk_mix=2.0)


def greedy(**kw) -> GenConfig:
    base = dict(n_predict=N_GEN, n_ctx=256, n_batch=64, n_threads=THREADS, temp=0.0)
    base.update(kw)
    return GenConfig(**base)


def baseline_gaps(model_path: Path, prompt: list[int], generated: list[int]) -> np.ndarray:
    """Top-2 logit gap of the plain model at every generated position (one batched decode)."""
    seq = prompt + generated
    m = lx.load_model(model_path)
    ctx = lx.create_context(m, n_ctx=len(seq) + 8, n_batch=len(seq), n_threads=THREADS)
    try:
        b = lx.Batch(len(seq))
        for i, t in enumerate(seq):
            b.add(t, i, logits=True)
        lx.decode(ctx, b)
        rows = lx.logits_rows(ctx, len(seq), lx.n_vocab(m))[len(prompt) - 1 : len(seq) - 1]
        top2 = np.sort(rows, axis=1)[:, -2:]
        return top2[:, 1] - top2[:, 0]
    finally:
        ctx.close()
        m.close()


def compare(ref: list[int], out: list[int], gaps: np.ndarray, what: str) -> int:
    """0 if equal, 1 if they diverge at a tie (baseline gap < TIE_EPS); AssertionError otherwise."""
    if out == ref:
        return 0
    i = next((j for j, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
    if i < len(gaps) and i < min(len(ref), len(out)) and gaps[i] < TIE_EPS:
        return 1
    raise AssertionError(
        f"{what}: diverges from plain decoding at generated position {i} "
        f"(baseline top-2 gap {gaps[i] if i < len(gaps) else float('nan'):.4g}): "
        f"{out[max(0, i - 2) : i + 3]} vs {ref[max(0, i - 2) : i + 3]}"
    )


def run(rt: Runtime, prompt: list[int], cfg: GenConfig) -> list[int]:
    return [ev.token for ev in rt.generate(prompt, cfg)]


class _Sleepy(DraftPolicy):
    """Drafting off after the first steps: the drafter ends its generation asleep."""

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        self.sleep = done >= 2
        return 0 if self.sleep else self.n_max


def check_prefix_reuse(rt: Runtime, cfg: GenConfig, sleep: bool = False) -> None:
    """Regenerate (the same prompt again), an edited last turn, a shared head: the memory keeps
    the longest prefix the new prompt shares with it (all but the last prompt token at most; on a
    recurrent target only an exact continuation) and the output is a full prefill's."""
    p1 = rt.tokenize(" ".join([PROMPT, "the world a hello"] * 3))
    pol = (lambda: _Sleepy(cfg.draft_n_max)) if sleep else (lambda: None)
    out1 = [ev.token for ev in rt.generate(p1, cfg, policy=pol(), reuse=True)]
    again = [ev.token for ev in rt.generate(p1, cfg, reuse=True)]
    assert rt.stats.n_cached == (0 if rt.recurrent else len(p1) - 1) and again == out1
    list(rt.generate(p1 + out1 + rt.tokenize(" world", add_special=False), cfg, policy=pol(), reuse=True))
    for edited in (p1[:-2] + rt.tokenize(" a a hello", add_special=False), p1[:3]):
        assert rt._ctx is not None and 0 in rt._ctx.held
        held = rt._ctx.held[0].tokens
        got = [ev.token for ev in rt.generate(edited, cfg, reuse=True)]
        want = 0 if rt.recurrent else min(len(edited) - 1, common_prefix(held, edited))
        assert rt.stats.n_cached == want and (rt.recurrent or want >= 2), (cfg.spec_type, edited)
        assert got == run(rt, edited, cfg), (cfg.spec_type, sleep, edited)
        list(rt.generate(p1 + out1, cfg, policy=pol(), reuse=True))


def _parity_sweep(
    rt: Runtime, model_path: Path, prompt: list[int], spec: str, label: str, record_property, **kw
) -> tuple[float, int]:
    ref = run(rt, prompt, greedy(**kw))
    assert rt.stats.stop_reason == "n_predict" and len(ref) == N_GEN
    gaps = baseline_gaps(model_path, prompt, ref)
    ties = 0
    drafted = accepted = 0
    rows = []
    for n in NS:
        out = run(rt, prompt, greedy(spec_type=spec, draft_n_max=n, **kw))
        st = rt.stats
        assert st.stop_reason == "n_predict" and st.n_tokens == len(out)
        ties += compare(ref, out, gaps, f"{label} N={n}")
        drafted += st.n_drafted
        accepted += st.n_accepted
        rows.append(f"N={n}: acc {st.acceptance:.2f} by pos {[round(x, 2) for x in st.acceptance_by_pos]}")
    acc = accepted / drafted if drafted else 0.0
    SUMMARY.append(f"{label}: acceptance {acc:.2f}, ties {ties} (eps {TIE_EPS}); " + "; ".join(rows))
    record_property(label, {"acceptance": acc, "ties": ties})
    return acc, ties


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg
