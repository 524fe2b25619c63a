"""`mtp-cli train`: an MTP head for a frozen trunk (the optional `train` extra: torch)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click

from gguf_tools.names import OWN_OUTPUT_TYPES, TRAINED_HEAD_TYPES
from mtp_cli.cli import llama_flags, render
from mtp_cli.cli import options as opt
from mtp_cli.cli.app import main


@main.command()
@click.argument("model", type=opt.PATH)
@opt.output
@click.option(
    "--text",
    "texts",
    multiple=True,
    type=opt.PATH,
    help="Text file for teacher-forced passes (repeatable; documents split at two blank lines).",
)
@click.option(
    "--prompts",
    type=opt.PATH,
    help="Prompts, one per line, answered greedily by the trunk (chat template applied when the model has one).",
)
@click.option(
    "--answer-penalty",
    "penalties",
    multiple=True,
    callback=lambda ctx, param, value: tuple(_penalty(v) for v in value),
    metavar="REPEAT[,FREQUENCY[,PRESENCE]]",
    help="Write the answers under these penalties (repeatable: each prompt gets one of them), so the head "
    "learns the text penalized decoding writes; e.g. 1 and 1.1 and 1,0.5,0.5 [default: greedy, no penalty].",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="The whole run: collecting data (at most --collect-share of it), then training. 0: export the "
    "checkpoint in the work folder again.",
)
@click.option(
    "--collect-share",
    "collect_share",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Share of --minutes spent collecting; what is left uncollected is collected by the next run "
    "with the same work folder.",
)
@click.option(
    "--head-type",
    "head_type",
    type=click.Choice(TRAINED_HEAD_TYPES),
    default="f16",
    show_default=True,
    help="Type of the head block's matrices in OUT.",
)
@click.option(
    "--own-output",
    "own_output",
    type=click.Choice([*OWN_OUTPUT_TYPES, "none"]),
    default="q4_0",
    show_default=True,
    help="Give the head its own full-vocabulary output matrix of this type (a copy of the trunk's; "
    "Q4_0 halved the draft step on SmolLM2) or none (read the trunk's).",
)
@click.option(
    "--fit-output",
    "fit_output",
    type=click.Choice(["trunk", *OWN_OUTPUT_TYPES]),
    default=None,
    help="Output matrix the head is trained against [default: the one OUT drafts with]; q4_0 with "
    "--own-output none for a head to be packed with its own Q4_0 copy later.",
)
@click.option(
    "--sidecar", is_flag=True, help="Write OUT as an MTP-only sidecar (use it with -md) instead of trunk + head."
)
@click.option("-s", "--seed", type=int, default=0, show_default=True)
@opt.threads
@click.option("--max-prompts", "max_prompts", type=int, default=None, help="Use at most this many prompts.")
@click.option(
    "--init",
    type=click.Choice(["random", "trunk", "slot"]),
    default="random",
    show_default=True,
    help="Start from random weights, the trunk's last block, or the file's head slot.",
)
@click.option(
    "--work",
    type=opt.PATH,
    default=None,
    help="Work folder (data, checkpoint, adopted trunk) [default: OUT.train]; rerun to resume.",
)
@click.option(
    "--lr",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Peak learning rate [default: 1.5e-3; not remembered by a resumed run]. The cosine decay "
    "(to 0.1 x this) spans every run of the checkpoint, so a resumed run starts partway down it; "
    "a lower --lr anneals a trained head.",
)
@llama_flags.repack  # (AMX never runs beside torch: --repack keeps the rest)
def train(
    model: Path,
    n_threads: int | None,
    own_output: str,
    sidecar: bool,
    repack: bool | None,
    penalties: tuple[tuple[float, float, float], ...],
    **kw: Any,
) -> None:
    """Train an MTP head for MODEL's frozen trunk and write OUT (needs: pip install 'mtp-cli[train]').

    MODEL: a glm4moe trunk (adopted or native, with or without a head slot), or a llama / qwen2 /
    qwen3 GGUF, adopted on the fly (OUT is then the adopted model plus the head). Data: the trunk's
    own greedy answers to --prompts and teacher-forced passes over --text (the built-in prompts when
    neither is given), collected through llama.cpp. Held-out top-1 agreement with the trunk is shown
    while training."""
    from mtp_cli import cpu_check
    from mtp_cli.llama_ext import default_threads
    from mtp_cli.train.data import CollectConfig
    from mtp_cli.train.pipeline import TrainJob, run_train

    if repack is not None:
        cpu_check.ensure(repack)  # (process-wide: every model the run loads)

    job = TrainJob(
        model=model,
        own_output=None if own_output == "none" else own_output,
        sidecar=sidecar,
        collect=CollectConfig(penalties=penalties),
        n_threads=n_threads if n_threads is not None else default_threads(),
        **kw,
    )
    try:
        with render.train_progress() as (on_stage, on_collect, on_train):
            res = run_train(job, on_stage=on_stage, on_collect=on_collect, on_train=on_train)
    except KeyboardInterrupt:
        work = job.work_dir
        render.err.print(f"interrupted: what was collected and trained is kept in {work}; the same command resumes it")
        sys.exit(130)
    render.train_summary(res, sidecar)


def _penalty(text: str) -> tuple[float, float, float]:
    """REPEAT[,FREQUENCY[,PRESENCE]] as (repeat, frequency, presence); BadParameter names the value."""
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    ok = 1 <= len(parts) <= 3 and all(math.isfinite(x) for x in parts) and parts[0] > 0
    if not ok:
        raise click.BadParameter(f"{text!r}: REPEAT[,FREQUENCY[,PRESENCE]], numbers, REPEAT above 0")
    r, f, p = (*parts, 0.0, 0.0)[:3]
    return r, f, p
