"""Helpers for the speed layer's tests: greedy configs, tokens with auto/adaptive resolved as the CLI
does, injected costs.
"""

from __future__ import annotations

from dataclasses import replace

from click.testing import CliRunner

from mtp_cli.cli import main
from mtp_cli.config import GenConfig
from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.auto import AutoDraft, parse_draft_n

THREADS = 1


FLAT = [1.0 + 0.05 * n for n in range(9)]  # a machine where verifying more tokens is nearly free


def greedy(**kw) -> GenConfig:
    base = dict(n_predict=48, n_ctx=512, n_batch=64, n_threads=THREADS, temp=0.0)
    base.update(kw)
    return GenConfig(**base)


def tokens(rt: Runtime, prompt, cfg: GenConfig, draft_n=None, controller=None, auto: AutoDraft | None = None):
    """The tokens of one generation; draft_n "auto" / "adaptive" resolved as the CLI does (by `auto`)."""
    if draft_n is None:
        return [ev.token for ev in rt.generate(prompt, cfg)]
    mode, n = parse_draft_n(draft_n)
    res = (auto or AutoDraft(rt)).resolve(replace(cfg, draft_mode=mode, draft_n_max=n or cfg.draft_n_max), controller)
    tokens.last = res  # type: ignore[attr-defined]
    return [ev.token for ev in rt.generate(prompt, res.config, policy=res.policy)]


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _profile(key: str, spec: str = "mtp", n: int = 2, p: float = 0.0) -> profiles.Profile:
    return profiles.Profile(
        key=key,
        model={"key": "m"},
        draft=None,
        machine={},
        spec_type=spec,
        draft_n_max=n,
        draft_p_min=p,
        tokens_per_second=100.0,
        ratio_vs_none=1.2,
    )
