"""Sampling (mtp_cli.sampling): speculative sampling emits plain sampling's distribution, the same
tokens for the same seed, and the chi-square test catches a biased acceptance rule.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from mtp_cli.config import GenConfig
from mtp_cli.runtime import Runtime
from mtp_cli.sampling import verify_sampled
from tests.parity import PROMPT, SUMMARY, THREADS, run


@pytest.fixture(scope="session")
def models(tiny_models):
    return tiny_models


def _chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for a chi-square with `dof` degrees of freedom (regularised upper gamma)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for the lower gamma
        term = tot = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(tot):
            n += 1
            term *= z / n
            tot += term
        return max(0.0, 1.0 - tot * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    b = z + 1 - a  # continued fraction for the upper gamma (Lentz)
    c, d = 1e300, 1 / b
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def two_sample_chi2(a: list, b: list, min_count: int = 10) -> tuple[float, int, float]:
    """Chi-square homogeneity test of two samples of categories (rare ones pooled): (stat, dof, p)."""
    ca, cb = Counter(a), Counter(b)
    cats = sorted(set(ca) | set(cb), key=lambda c: -(ca[c] + cb[c]))
    keep = [c for c in cats if ca[c] + cb[c] >= min_count]
    rest = [c for c in cats if c not in keep]
    rows = [[ca[c] for c in keep] + [sum(ca[c] for c in rest)], [cb[c] for c in keep] + [sum(cb[c] for c in rest)]]
    cols = [j for j in range(len(rows[0])) if rows[0][j] + rows[1][j] > 0]
    rows = [[r[j] for j in cols] for r in rows]
    na, nb = sum(rows[0]), sum(rows[1])
    stat = 0.0
    for j in range(len(cols)):
        tot = rows[0][j] + rows[1][j]
        for r, n in ((rows[0], na), (rows[1], nb)):
            e = tot * n / (na + nb)
            stat += (r[j] - e) ** 2 / e
    dof = len(cols) - 1
    return stat, dof, _chi2_sf(stat, dof) if dof > 0 else 1.0


# the structured model's top logit leads by ~45: a high temperature spreads it (top-1 ~ 0.5)
SAMPLING = dict(temp=30.0, top_k=5, top_p=1.0, min_p=0.0)


N_SEEDS = 600


SIG = 1e-3


def _sample_runs(
    rt: Runtime,
    prompt: list[int],
    spec: str,
    seeds: range,
    accepted: list[int] | None = None,
    sampling: dict | None = None,
) -> list[tuple[int, ...]]:
    """The first three tokens for each seed; `accepted` gets each run's count of accepted drafts."""
    out = []
    for seed in seeds:
        cfg = GenConfig(
            n_predict=3,
            n_ctx=64,
            n_batch=32,
            n_threads=THREADS,
            spec_type=spec,
            draft_n_max=2,
            seed=seed,
            **(sampling or SAMPLING),
        )
        out.append(tuple(ev.token for ev in rt.generate(prompt, cfg)))
        if accepted is not None:
            accepted.append(rt.stats.n_accepted)
    return out


def biased_verify(sampler, ctx, rows, drafts) -> tuple[int, int]:
    """A classic mistake in place of verify_sampled: a draft token is kept whenever it is the
    target's most likely token (instead of only when it equals the target's sample)."""
    a = 0
    while True:
        s = sampler.sample(ctx, a, rows[a])
        if a < len(drafts) and (s == drafts[a] or int(rows[a].argmax()) == drafts[a]):
            a += 1
            continue
        return a, s


def _p_values(x: list[tuple[int, ...]], y: list[tuple[int, ...]]) -> dict[str, float]:
    ps = {f"pos{i + 1}": two_sample_chi2([t[i] for t in x], [t[i] for t in y])[2] for i in range(3)}
    ps["joint23"] = two_sample_chi2([t[1:] for t in x], [t[1:] for t in y])[2]
    return ps


@pytest.fixture(scope="module")
def sampling_rt(models):
    s = models("glm4moe", head_noise=0.5)
    rt = Runtime.load(s["full"], spec_type="mtp")
    yield rt
    rt.close()


def test_sampling_same_seed_same_tokens(sampling_rt):
    """Same seed -> spec sampling emits exactly plain sampling's tokens (one draw per token)."""
    rt = sampling_rt
    prompt = rt.tokenize(PROMPT)
    mism = 0
    acc = []
    for seed in range(25):
        cfg = GenConfig(n_predict=30, n_ctx=64, n_threads=THREADS, seed=seed, **SAMPLING)
        plain = run(rt, prompt, cfg)
        spec = run(rt, prompt, GenConfig(**{**cfg.__dict__, "spec_type": "mtp", "draft_n_max": 3}))
        acc.append(rt.stats.acceptance)
        mism += plain != spec
    SUMMARY.append(f"sampling same-seed: {25 - mism}/25 identical, mean acceptance {np.mean(acc):.2f}")
    assert mism <= 1 and 0.2 < np.mean(acc) < 0.9


def test_sampling_distribution_matches_plain(sampling_rt):
    """Disjoint seeds: spec sampling's first three tokens (marginals and the joint of tokens 2-3,
    which come from verify passes) are distributed as plain sampling's."""
    rt = sampling_rt
    prompt = rt.tokenize(PROMPT)
    plain = _sample_runs(rt, prompt, "none", range(0, N_SEEDS))
    spec = _sample_runs(rt, prompt, "mtp", range(N_SEEDS, 2 * N_SEEDS))
    ps = _p_values(plain, spec)
    SUMMARY.append(
        f"sampling chi-square (spec vs plain, {N_SEEDS} seeds each): "
        + ", ".join(f"{k} p={v:.3f}" for k, v in ps.items())
    )
    assert min(ps.values()) > SIG, ps


def test_sampling_test_detects_a_biased_acceptance_rule(sampling_rt):
    """The same test fails for a classic mistake: keeping a draft token whenever it is the target's
    most likely token (instead of only when it equals the target's sample)."""
    rt = sampling_rt
    prompt = rt.tokenize(PROMPT)
    plain = _sample_runs(rt, prompt, "none", range(0, N_SEEDS))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Runtime, "_verify_sampled", staticmethod(biased_verify))
        spec = _sample_runs(rt, prompt, "mtp", range(N_SEEDS, 2 * N_SEEDS))
    ps = _p_values(plain, spec)
    SUMMARY.append("biased rule chi-square: " + ", ".join(f"{k} p={v:.2g}" for k, v in ps.items()))
    assert min(ps.values()) < SIG, ps
    assert verify_sampled is Runtime._verify_sampled  # the patch is gone
