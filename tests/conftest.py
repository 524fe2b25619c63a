"""Shared fixtures: every test gets its own config and cache folders and quiet logs; the tiny
models and the short training run are built once per session."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from mtp_cli import llama_ext as lx
from tests import factory
from tests.factory import EOS_ID, tiny_model_set


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory, monkeypatch) -> dict[str, Path]:
    """Profiles and the demo cache in fresh folders: a test never reads or writes the user's."""
    base = tmp_path_factory.mktemp("home")
    dirs = {"config": base / "config", "cache": base / "cache"}
    monkeypatch.setenv("MTP_CLI_CONFIG_DIR", str(dirs["config"]))
    monkeypatch.setenv("MTP_CLI_CACHE", str(dirs["cache"]))
    return dirs


@pytest.fixture(autouse=True)
def prior_costs(request, monkeypatch):
    """Verify costs are the prior, not this busy machine's timings: a drafter that sizes its drafts
    by them (the lookup) decides the same in every run (tests marked measured_costs measure)."""
    if request.node.get_closest_marker("measured_costs") is None:
        from mtp_cli.step_costs import StepCosts

        monkeypatch.setattr(StepCosts, "observe", lambda self, k, seconds: None)


@pytest.fixture(autouse=True)
def attention_off(request, monkeypatch):
    """Flash attention stays off for several sequences as for one: what this machine's probe would
    choose must not change which kernels a test compares (tests marked measured_attention measure)."""
    from mtp_cli import attention_probe

    monkeypatch.setattr(attention_probe, "_verdicts", {})
    if request.node.get_closest_marker("measured_attention") is None:
        monkeypatch.setattr(attention_probe, "measure", lambda shape, n_seq, n_threads: (1.0, 1.0))


@pytest.fixture
def config_dir(isolated_dirs) -> Path:
    """Where profiles are stored in this test."""
    return isolated_dirs["config"]


@pytest.fixture(scope="session", autouse=True)
def quiet_logs():
    lx.quiet_logs()
    logging.getLogger("gguf_tools").setLevel(logging.ERROR)
    logging.getLogger("mtp_cli").setLevel(logging.ERROR)


@pytest.fixture(scope="session", autouse=True)
def safe_buffers(tmp_path_factory, quiet_logs):
    """The CPU self-check before any test loads a model (tests load with llama_ext directly too),
    its cache in a folder of the session's; and torch runs in this process (the train tests), so
    ggml's AMX path never does."""
    from mtp_cli import cpu_check

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MTP_CLI_CACHE", str(tmp_path_factory.mktemp("cpu-check")))
        cpu_check.torch_in_process()
        cpu_check.ensure()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """tiny_models(arch, weights="structured", dtype="f32", **overrides) -> {"full","trunk","sidecar"}, cached.
    Special overrides (not TinySpec fields): perturb=<fraction> makes a structured model whose greedy
    successor differs from the standard one on that fraction of tokens (a partially agreeing draft
    model); eos_after=<token> makes the structured model emit EOS after that token."""
    root = tmp_path_factory.mktemp("tiny")
    cache: dict[tuple, dict[str, Path]] = {}

    def get(arch: str, weights: str = "structured", dtype: str = "f32", **kw) -> dict[str, Path]:
        key = (arch, weights, dtype, tuple(sorted(kw.items())))
        if key in cache:
            return cache[key]
        perturb = kw.pop("perturb", None)
        eos_after = kw.pop("eos_after", None)
        with pytest.MonkeyPatch.context() as mp:
            if perturb is not None:
                mp.setattr(factory, "token_permutation", _perturbed(factory.token_permutation, perturb))
            if eos_after is not None:
                mp.setattr(factory, "_tensor_arrays", _eos_after(factory._tensor_arrays, eos_after))
            cache[key] = tiny_model_set(root / f"set{len(cache)}", arch, weights, dtype, **kw)  # type: ignore[arg-type]
        return cache[key]

    return get


def _perturbed(orig, frac: float):
    def perm(spec):
        p = orig(spec).copy()
        rng = np.random.default_rng(1234)
        src = np.nonzero(p >= 0)[0]
        chosen = rng.choice(src, size=int(frac * len(src)), replace=False)
        p[chosen] = p[rng.permutation(chosen)]  # still injective: successors shuffled
        return p

    return perm


def _eos_after(orig, x: int):
    def arrays(spec):
        t = orig(spec)
        t["output.weight"][EOS_ID] = 1.5 * t["token_embd.weight"][x]  # EOS beats P(x) after x
        return t

    return arrays


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """One short training run on a tiny adopted trunk, shared by the train tests."""
    pytest.importorskip("torch").set_num_threads(1)
    from mtp_cli.train.pipeline import run_train
    from tests.trainkit import tiny_train_job, tiny_trunk

    d = tmp_path_factory.mktemp("train")
    src = tiny_trunk(d)
    job = tiny_train_job(d, src)
    stages: list[str] = []
    res = run_train(job, on_stage=stages.append)
    return {"dir": d, "src": src, "job": job, "res": res, "stages": stages}
