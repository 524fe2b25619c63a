"""`mtp-cli train` as a library call: adopt if needed -> collect -> train -> export.

    res = run_train(TrainJob(model=Path("smollm2.gguf"), out=Path("smollm2-mtp.gguf"), minutes=10))

MODEL is a glm4moe trunk (adopted or native, with or without a head slot), a step35 one adopted
from Llama 3.x, or a llama / qwen2 / qwen3 GGUF, which is adopted on the fly into the work folder
(OUT is then the adopted model plus the trained head). The work folder (default OUT + ".train/")
keeps the adopted trunk, the collected data and the training checkpoint: running the same command
again resumes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf_tools import ops
from gguf_tools.adopt_step35 import adopted as adopted_step35
from gguf_tools.errors import RefusedError
from gguf_tools.gguf_file import open_gguf
from gguf_tools.gguf_write import check_output
from gguf_tools.names import ADOPT_TARGET, ADOPTABLE_ARCHS, OWN_OUTPUT, OWN_OUTPUT_TYPES, TRAINED_HEAD_TYPES
from gguf_tools.own_output import drafted_output
from mtp_cli.config import GenConfig
from mtp_cli.errors import ConfigError
from mtp_cli.prompts import read_prompts
from mtp_cli.stats import GenStats
from mtp_cli.train import require_torch
from mtp_cli.train.collect import CollectProgress, collect
from mtp_cli.train.data import INDEX, CollectConfig, Store, builtin_prompts, is_heldout, read_documents, source_key

if TYPE_CHECKING:  # annotations only
    import numpy as np

    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trainer import TrainConfig, TrainProgress, TrainResult
    from mtp_cli.train.trunk import Trunk


@dataclass(frozen=True)
class TrainJob:
    model: Path
    out: Path
    texts: Sequence[Path] = ()  # text files for teacher-forced passes
    prompts: Path | None = None  # one prompt per line (answered greedily by the trunk)
    minutes: float = 30.0  # the whole run: collection (at most collect_share of it), then training; 0: export only
    collect_share: float = 0.5
    head_type: str = "f16"
    own_output: str | None = "q4_0"  # head-owned output matrix (names.OWN_OUTPUT_TYPES) or None: the trunk's
    # the output matrix trained against: "trunk" or an own-output type (for a head packed with its own
    # copy later, as the demo's is); None: the one OUT drafts with
    fit_output: str | None = None
    sidecar: bool = False  # write an MTP-only sidecar instead of the packed model
    seed: int = 0
    work: Path | None = None
    init: str = "random"  # random | trunk | slot (mtp_cli.train.trunk.initial_weights)
    max_prompts: int | None = None
    n_threads: int = 1
    overwrite: bool = False
    lr: float | None = None  # peak learning rate (None: TrainConfig's)
    collect: CollectConfig = field(default_factory=CollectConfig)
    train: TrainConfig | None = None  # None: the defaults, with minutes, seed and threads

    @property
    def work_dir(self) -> Path:
        return self.work if self.work is not None else self.out.with_name(self.out.name + ".train")


@dataclass
class JobResult:
    out: Path
    trunk: Path  # the glm4moe trunk the head belongs to (adopted into the work folder, or MODEL)
    store_rows: int
    train: TrainResult
    heldout_prompts: list[str]


def sources(job: TrainJob) -> tuple[list[str], list[str]]:
    """(documents, prompts): the given files, or the built-in prompts when neither is given (answers are
    what the head drafts at decode time; text only adds variety)."""
    if not job.texts and job.prompts is None:
        docs, ps = [], builtin_prompts()
    else:
        docs = [d for p in job.texts for d in read_documents(p)]
        ps = read_prompts(job.prompts) if job.prompts is not None else []
    if job.max_prompts is not None:
        ps = ps[: job.max_prompts]
    return docs, ps


def heldout_prompts(prompts: Sequence[str], seed: int = 0, frac: float | None = None) -> list[str]:
    """The prompts collection held out (never trained on): evaluate decode-time acceptance on these."""
    f = CollectConfig().heldout if frac is None else frac
    return [p for p in prompts if is_heldout(source_key("prompt", p), seed, f)]


def prepare_trunk(job: TrainJob) -> Path:
    """MODEL itself when it is glm4moe, else its adoption in the work folder (made once)."""
    gf = open_gguf(job.model)
    if gf.arch == ADOPT_TARGET or adopted_step35(gf):
        return job.model  # (a trunk already adopted: as glm4moe, or as step35 for Llama 3.x)
    if gf.arch not in ADOPTABLE_ARCHS:
        raise RefusedError(
            f"training needs a {ADOPT_TARGET} trunk or a {'/'.join(ADOPTABLE_ARCHS)} model to adopt, not {gf.arch!r}",
            job.model,
        )
    adopted = job.work_dir / "adopted.gguf"
    if not adopted.exists():
        job.work_dir.mkdir(parents=True, exist_ok=True)
        ops.adopt(job.model, adopted)
    return adopted


def check_job(job: TrainJob) -> None:
    """Refuse a job's bad settings before any work (ConfigError naming the setting)."""
    require_torch()
    if job.head_type not in TRAINED_HEAD_TYPES:
        raise ConfigError(f"unknown `head_type` {job.head_type!r} ({', '.join(TRAINED_HEAD_TYPES)})")
    if job.own_output is not None and job.own_output not in OWN_OUTPUT_TYPES:
        raise ConfigError(f"unknown `own_output` type {job.own_output!r} (none, {', '.join(OWN_OUTPUT_TYPES)})")
    if job.fit_output is not None and job.fit_output not in ("trunk", *OWN_OUTPUT_TYPES):
        raise ConfigError(f"unknown `fit_output` type {job.fit_output!r} (trunk, {', '.join(OWN_OUTPUT_TYPES)})")
    if job.lr is not None and not (math.isfinite(job.lr) and job.lr > 0):
        raise ConfigError(f"`lr` must be above 0, got {job.lr}")
    if job.minutes < 0:
        raise ConfigError(f"`minutes` must be >= 0, got {job.minutes}")
    if not 0.0 <= job.collect_share <= 1.0:
        raise ConfigError(f"`collect_share` must be between 0 and 1, got {job.collect_share}")
    check_output(job.out, [job.model], job.overwrite)


def run_train(
    job: TrainJob,
    *,
    on_stage: Callable[[str], None] | None = None,
    on_collect: Callable[[CollectProgress], None] | None = None,
    on_train: Callable[[TrainProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> JobResult:
    from mtp_cli.train.trunk import Trunk

    check_job(job)
    stage = on_stage or (lambda s: None)
    require_torch().set_num_threads(max(1, job.n_threads))
    t0 = time.monotonic()
    stage("adopt")
    trunk_path = prepare_trunk(job)
    trunk = Trunk(trunk_path)  # refuses what the head cannot express, before collecting
    job.work_dir.mkdir(parents=True, exist_ok=True)
    docs, prompts = sources(job)
    stage("collect")
    store = _collect(job, trunk, docs, prompts, t0, on_collect, should_stop)
    stage("train")
    head, result = _train(job, trunk, store, t0, on_train, should_stop)
    stage("export")
    _export(job, trunk_path, head.weights())
    return JobResult(job.out, trunk_path, store.n_rows, result, heldout_prompts(prompts, job.seed, job.collect.heldout))


def _collect(
    job: TrainJob,
    trunk: Trunk,
    docs: list[str],
    prompts: list[str],
    t0: float,
    on_collect: Callable[[CollectProgress], None] | None,
    should_stop: Callable[[], bool] | None,
) -> Store:
    """At most collect_share of the run; what is left is collected by the next run in the work folder."""
    collect_until = t0 + job.minutes * 60.0 * job.collect_share
    data = job.work_dir / "data"
    if job.minutes * job.collect_share > 0 or not (data / INDEX).is_file():
        ccfg = replace(job.collect, seed=job.seed, n_threads=job.n_threads)
        store = collect(
            trunk.params.path,
            data,
            texts=docs,
            prompts=prompts,
            cfg=ccfg,
            progress=on_collect,
            should_stop=should_stop,
            deadline=collect_until,
        )
    else:  # no time to collect: train on (or export from) what the work folder holds
        store = Store.open(data, (trunk.params.dims.n_embd, job.collect.top_k, trunk.params.n_vocab))
    if should_stop and should_stop():
        raise KeyboardInterrupt
    if not store.split("train"):
        raise ConfigError(
            f"{job.work_dir}: no training data collected yet: give the run more `minutes` "
            "(and a `collect_share` above 0)"
        )
    return store


def _train(
    job: TrainJob,
    trunk: Trunk,
    store: Store,
    t0: float,
    on_train: Callable[[TrainProgress], None] | None,
    should_stop: Callable[[], bool] | None,
) -> tuple[MtpHead, TrainResult]:
    from mtp_cli.train.head import MtpHead
    from mtp_cli.train.trainer import TrainConfig, Trainer

    head = MtpHead.from_trunk(trunk, training_weights(trunk, job), fast=True)
    # (after the head's setup: it is part of the run, and so is the export that follows)
    left = max(0.0, job.minutes * 60.0 - (time.monotonic() - t0) - export_seconds(job, trunk))
    tcfg = (
        job.train
        if job.train is not None
        else TrainConfig(minutes=left / 60.0, seed=job.seed, n_threads=job.n_threads, max_steps=None if left > 0 else 0)
    )
    if job.lr is not None:
        tcfg = replace(tcfg, lr=job.lr)
    trainer = Trainer(head, store, tcfg, checkpoint=job.work_dir / "head.ckpt")
    return head, trainer.run(on_train, should_stop)


# export's cost, kept out of the training budget: requantizing the own output (numpy, ~28M weights/s
# measured for q4_0 on 2 cores), writing the head, then one copy of the trunk at a slow disk's pace
EXPORT_FIXED_S, QUANTIZE_WEIGHTS_PER_S, COPY_BYTES_PER_S = 0.3, 25e6, 300e6


def export_seconds(job: TrainJob, trunk: Trunk) -> float:
    p = trunk.params
    own = p.n_vocab * p.dims.n_embd / QUANTIZE_WEIGHTS_PER_S if job.own_output else 0.0
    return EXPORT_FIXED_S + own + os.path.getsize(p.path) / COPY_BYTES_PER_S


def _export(job: TrainJob, trunk_path: Path, weights: dict[str, np.ndarray]) -> None:
    from mtp_cli.train.export import export_model, write_sidecar

    write = write_sidecar if job.sidecar else export_model
    write(trunk_path, weights, job.out, job.head_type, overwrite=job.overwrite, own_output=job.own_output)


def training_weights(trunk: Trunk, job: TrainJob) -> dict[str, np.ndarray]:
    """The head's starting weights, plus the output matrix it drafts with when that is not the trunk's
    (frozen: export writes the same values again, from the trunk; a slot's own copy is never exported)."""
    from mtp_cli.train.trunk import initial_weights

    w = initial_weights(trunk, job.init, job.seed)
    w.pop(OWN_OUTPUT, None)
    fit = job.fit_output or job.own_output or "trunk"
    if fit != "trunk":
        w[OWN_OUTPUT] = drafted_output(trunk.gf, fit)
    return w


def measure_acceptance(
    model: str | os.PathLike[str],
    prompts: Sequence[str],
    *,
    sidecar: str | None = None,
    n_predict: int = 128,
    draft_n_max: int = 3,
    n_threads: int = 1,
    chat: bool | None = None,
    n_ctx: int = 1024,
    edits: Mapping[str, Any] | None = None,
) -> GenStats:
    """Greedy decoding with the MTP head through the Runtime; the generations' pooled stats
    (acceptance by draft position: acceptance_by_pos). `edits`: GenConfig's row-edit fields
    (penalties, logit_bias, ignore_eos) the generations run with."""
    from mtp_cli.chat import chat_prompt
    from mtp_cli.runtime import Runtime

    cfg = GenConfig(
        n_predict=n_predict,
        n_ctx=n_ctx,
        n_threads=n_threads,
        spec_type="mtp",
        draft_n_max=draft_n_max,
        temp=0.0,
        **(edits or {}),
    )
    runs = []
    with Runtime.load(model, spec_type="mtp", draft_model=sidecar) as rt:
        use_chat = chat if chat is not None else isinstance(rt.chat_file.get("tokenizer.chat_template"), str)
        for p in prompts:
            text = chat_prompt(rt.chat_file, p, *rt.special_texts()) if use_chat else p
            gen = rt.generate(rt.tokenize(text, add_special=True, parse_special=use_chat), cfg)
            for _ in gen:
                pass
            runs.append(gen.stats)
    return GenStats.pooled(runs)


__all__ = [
    "TrainJob",
    "JobResult",
    "check_job",
    "run_train",
    "sources",
    "heldout_prompts",
    "prepare_trunk",
    "measure_acceptance",
    "Store",
]
