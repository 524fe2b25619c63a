"""`mtp-cli tune` and `mtp-cli bench`: how fast each draft setting runs on this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn

from mtp_cli.cli import options as opt
from mtp_cli.cli import render
from mtp_cli.cli.app import main
from mtp_cli.cli.demo_model import demo_file
from mtp_cli.cli.gen_options import flash_attn
from mtp_cli.cli.llama_flags import llama_compat, load_of, placement


@main.command()
@opt.model(required=False, help="Target GGUF (with an MTP head) [default: the demo model].")
@opt.draft_model()
@opt.prompts
@click.option("--budget", type=float, default=60.0, show_default=True, help="Seconds to spend measuring.")
@click.option("--n-max", "n_max", type=int, default=8, show_default=True, help="Largest draft length tried.")
@opt.threads
@opt.gpu_layers
@placement
@flash_attn
@click.option("--no-save", is_flag=True, help="Measure and report only; do not save the profile.")
@opt.as_json
@llama_compat
def tune(
    model: Path | None, draft_model: Path | None, prompts: Path | None, no_save: bool, as_json: bool, **kw: Any
) -> None:
    """Find the fastest draft setting for MODEL on this machine (possibly: off) and save it as the
    profile `--spec-draft-n-max auto` uses. Also shows the machine's cost model: why MTP pays here, or not."""
    from mtp_cli.speed.tune import tune as run_tune

    model = model or demo_file()
    texts = opt.read_prompt_texts(prompts)
    load, kw = load_of({**kw, "draft_model": draft_model})
    with Live(console=render.err, refresh_per_second=8, transient=True) as live:
        res = run_tune(
            model,
            load,
            prompts=texts,
            save=not no_save,
            progress=lambda ev: live.update(render.tune_table(ev.result, ev.message)),
            **kw,
        )
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    out = render.out
    out.print(render.tune_table(res, f"done in {res.elapsed:.0f} s ({res.rungs} rungs)"))
    out.print(render.tune_bars(res))
    if res.cost is not None:
        out.print(render.cost_table(res))
    best = res.best
    assert best is not None
    verdict = "off: plain decoding is fastest here" if best.off else f"{best.name}: {best.ratio:.2f}x plain decoding"
    out.print(f"[bold]best:[/] {verdict}")
    if res.profile_path is not None and res.profile is not None:
        out.print(
            f"saved profile {res.profile.key} to {res.profile_path}; use it with "
            f"`mtp-cli generate -m {model} --spec-draft-n-max auto`",
            highlight=False,
        )


@main.command()
@opt.model(required=False, help="Target GGUF [default: the demo model].")
@opt.draft_model()
@opt.prompts
@click.option(
    "-n",
    "--n-predict",
    "n_predict",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Tokens generated per prompt.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Repeats per setting (the median is shown).",
)
@opt.threads
@opt.gpu_layers
@placement
@opt.as_json
@llama_compat
def bench(model: Path | None, draft_model: Path | None, prompts: Path | None, as_json: bool, **kw: Any) -> None:
    """none, ngram, mtp at N = 1..4, auto and adaptive side by side: same prompts, greedy, medians of repeats."""
    from mtp_cli.speed.bench import bench as run_bench

    model = model or demo_file()
    texts = opt.read_prompt_texts(prompts)
    load, kw = load_of({**kw, "draft_model": draft_model})
    with Progress(
        TextColumn("[bold]bench"), BarColumn(), TextColumn("{task.description}"), console=render.err, transient=True
    ) as bar:
        task = bar.add_task("", total=None)
        res = run_bench(
            model,
            load,
            prompts=texts,
            **kw,
            progress=lambda ev: bar.update(task, completed=ev.done, total=ev.total, description=ev.message),
        )
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    render.out.print(render.bench_table(res))
