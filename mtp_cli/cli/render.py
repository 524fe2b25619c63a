"""Rendering (rich): tables, summaries, progress. Everything the CLI prints that is not data."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.bar import Bar
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from gguf_tools.ops import WriteResult
from gguf_tools.report import InspectReport

err = Console(stderr=True, soft_wrap=True)
out = Console()


def one_line_error(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def note(message: str) -> None:
    """A dim line on stderr."""
    err.print(f"[dim]{escape(message)}[/]", highlight=False)


@contextmanager
def byte_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def written(res: WriteResult) -> None:
    err.print(f"wrote {res.path} ({res.tensors} tensors, {res.file_bytes / 1e6:.1f} MB)")


STOP_WORDS = {
    "eog": "end of text",
    "n_predict": "-n reached",
    "ctx_full": "context full (raise -c)",
    "interrupted": "interrupted",
}


BY_POS_SHOWN = 8  # (a lookup drafts up to 32: the first positions tell the story)


def _by_pos(acceptance: list[float], drafted: list[int]) -> str:
    """Acceptance by draft position, as far as anything was drafted (not the cap's untried zeros)."""
    n = max((i + 1 for i, d in enumerate(drafted) if d), default=0)
    shown = " ".join(f"{a:.0%}" for a in acceptance[: min(n, BY_POS_SHOWN)])
    return shown + (f" ... ({n} positions)" if n > BY_POS_SHOWN else "")


def gen_stats(s: Any) -> None:
    err.print(
        f"[dim]{s.n_prompt} prompt tokens"
        + (f" ({s.n_prompt - s.n_cached} decoded, {s.n_cached} cached)" if s.n_cached else "")
        + f" at {s.prompt_tokens_per_second:.1f} t/s; "
        f"{s.n_tokens} generated "
        + (f"at {s.tokens_per_second:.1f} t/s" if s.tokens_per_second else "(none after the prompt pass to time)")
        + "; stop: "
        f"{STOP_WORDS.get(s.stop_reason, s.stop_reason)}[/]",
        highlight=False,
    )
    if _drafting(s.spec_type) and not s.n_drafted:
        err.print(f"[dim]{s.spec_type}: nothing drafted was verified ({s.n_verify} plain steps)[/]", highlight=False)
    elif _drafting(s.spec_type):
        by_pos = _by_pos(s.acceptance_by_pos, s.drafted_at)
        err.print(
            f"[dim]{s.spec_type}: {s.n_verify} verify passes, {s.tokens_per_pass:.2f} tokens/pass, "
            f"acceptance {s.acceptance:.1%} ({s.n_accepted}/{s.n_drafted}), "
            f"{s.mean_accepted_per_pass:.2f} accepted/pass, by position: {by_pos}[/]",
            highlight=False,
        )


def tune_table(res: Any, caption: str) -> Table:
    t = Table(
        "setting",
        "status",
        "predicted",
        "tok/s",
        "x off",
        "accept",
        "repeats",
        box=None,
        header_style="bold",
        caption=f"{caption}  [{res.elapsed:.0f}/{res.budget:.0f} s]",
        caption_justify="left",
    )
    for c in res.candidates:
        tps = c.tokens_per_second
        style = "bold green" if c.status == "best" else ("dim" if c.status in ("pruned", "dropped") else None)
        t.add_row(
            c.name,
            c.status,
            "-" if c.predicted is None else f"{c.predicted:.2f}x",
            "-" if tps is None else f"{tps:.1f}",
            "-" if c.ratio is None else f"{c.ratio:.2f}",
            "-" if c.acceptance is None else f"{c.acceptance:.0%}",
            " ".join(f"{x:.0f}" for x in c.runs) or "-",
            style=style,
        )
    return t


def tune_bars(res: Any) -> Table:
    measured = sorted((c for c in res.candidates if c.tokens_per_second), key=lambda c: -c.tokens_per_second)
    top = measured[0].tokens_per_second if measured else 1.0
    t = Table(
        "setting",
        "tokens/s (last rung measured)",
        "",
        "x off",
        box=None,
        header_style="bold",
        title="tokens per second by setting",
        title_justify="left",
    )
    for c in measured:
        t.add_row(
            c.name,
            Bar(top, 0, c.tokens_per_second, width=40, color="green" if c.status == "best" else "blue"),
            f"{c.tokens_per_second:.1f}",
            "-" if c.ratio is None else f"{c.ratio:.2f}",
            style="bold" if c.status == "best" else None,
        )
    return t


def cost_table(res: Any) -> Table:
    cm = res.cost
    acc = res.acceptance_by_pos
    t = Table(
        "N",
        "v(N)",
        "drafts",
        "o(N)",
        "needs tok/step",
        "needs alpha",
        "predicted",
        box=None,
        header_style="bold",
        title_justify="left",
        title=(
            f"cost model: T = {cm.t_ms:.3g} ms per plain token (llama_decode); one head row c = "
            f"{cm.draft:.2f} T; plain decoding's overhead {cm.overhead_plain:.2f} T"
        ),
        caption=(
            "a step at N costs v(N) (verify N+1 tokens) + drafts (c(E) + (N-1) c: the first head decode "
            "carries the E-1 tokens accepted last step) + o(N) (Python); MTP pays when tokens per step "
            "E exceed that / (1 + plain overhead). 'needs alpha': the same for i.i.d. per-token "
            "acceptance (-: not even at 100%). 'predicted': the speed ratio with the acceptance measured "
            f"at N={cm.n_max} ({' '.join(f'{a:.2f}' for a in acc[:8])})"
        ),
        caption_justify="left",
    )
    for n in range(1, cm.n_max + 1):
        a = cm.break_even_alpha(n)
        e = cm.break_even_tokens(n)
        t.add_row(
            str(n),
            f"{cm.verify[n]:.2f}",
            f"{cm.draft_cost(n, min(e, n + 1.0)):.2f}",
            f"{cm.overhead_at(n):.2f}",
            f"{e:.2f}",
            "-" if a is None else f"{a:.2f}",
            f"{cm.ratio(n, acc):.2f}x",
        )
    return t


def bench_table(res: Any) -> Table:
    t = Table(
        "setting",
        "tok/s",
        "x none",
        "accept",
        "tok/pass",
        "spread",
        "",
        box=None,
        header_style="bold",
        caption=f"{res.prompts} prompts x {res.n_predict} tokens, greedy, median of {res.repeats}",
        caption_justify="left",
    )
    for r in res.rows:
        if r.result is None:
            t.add_row(r.name, "-", "-", "-", "-", "-", r.detail, style="dim")
            continue
        s = r.result.stats
        drafted = _drafting(s.spec_type) and s.n_drafted
        t.add_row(
            r.name,
            f"{s.tokens_per_second:.1f}",
            f"{r.ratio:.2f}" if r.ratio else "-",
            f"{s.acceptance:.0%}" if drafted else "-",
            f"{s.tokens_per_pass:.2f}",
            f"{r.result.spread:.1%}",
            r.detail,
        )
    return t


def inspect_report(rep: InspectReport) -> None:
    t = Table.grid(padding=(0, 2))
    t.add_row("file", f"{rep.path} ({rep.file_bytes / 1e6:.1f} MB)")
    t.add_row("architecture", rep.arch + (f"  ({rep.name})" if rep.name else ""))
    t.add_row("blocks", f"{rep.block_count} = {rep.trunk_blocks} trunk + {rep.head_blocks} head")
    t.add_row("n_embd / n_vocab", f"{rep.n_embd} / {rep.n_vocab}")
    t.add_row("tensors", f"{rep.tensor_count}: " + ", ".join(f"{n} {k}" for k, n in rep.tensor_types.items()))
    t.add_row(
        "head", f"{len(rep.head_tensors)} tensors, {rep.head_bytes / 1e6:.2f} MB ({rep.head_share:.1%} of the file)"
    )
    t.add_row("verdict", f"[bold]{rep.verdict}[/]")
    t.add_row("", rep.advice)
    out.print(t)
    if rep.head_tensors:
        ht = Table("head tensor", "type", "shape", "bytes", box=None, header_style="bold")
        for h in rep.head_tensors:
            ht.add_row(h.name, h.type, "x".join(map(str, h.shape)), f"{h.bytes:,}")
        out.print(ht)


class _BudgetBar(BarColumn):
    """A bar that also moves with the clock: a stage ends at its work's end or its time budget
    (task field `budget_s`), whichever comes first."""

    def render(self, task: Any) -> Any:
        bar = super().render(task)
        budget = task.fields.get("budget_s")
        if task.total and budget and budget < float("inf") and task.stop_time is None and task.elapsed:
            bar.completed = max(bar.completed, min(1.0, task.elapsed / budget) * task.total)
        return bar


def _collect_info(p: Any) -> str:
    rates = [
        f"trunk {p.tokens_per_s:.0f} tok/s" if p.tokens_per_s else "",
        f"answers {p.gen_tokens_per_s:.0f} tok/s" if p.gen_tokens_per_s else "",
    ]
    earlier = f" ({p.before} from earlier runs)" if p.before else ""
    return ", ".join([f"{p.done}/{p.total} sources{earlier}", f"{p.rows} rows", *[r for r in rates if r]])


@contextmanager
def train_progress() -> Iterator[tuple[Callable[[str], None], Callable[[Any], None], Callable[[Any], None]]]:
    """(on_stage, on_collect, on_train) callbacks drawing the collection, training and export bars; each
    stage's bar is completed and its clock stopped when the next stage starts."""
    from rich.progress import TimeElapsedColumn

    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    with Progress(
        TextColumn("[bold]{task.description}"),
        _BudgetBar(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as bar:
        tasks: dict[str, Any] = {}

        def finish() -> None:
            for t in tasks.values():
                if bar.tasks[t].stop_time is None:
                    bar.update(t, completed=bar.tasks[t].total or 1, total=bar.tasks[t].total or 1)
                    bar.stop_task(t)

        def on_stage(s: str) -> None:
            finish()
            if s == "export":
                tasks["export"] = bar.add_task("exporting", total=None, info="")

        def on_collect(p: Any) -> None:
            left = p.total - p.before
            if "collect" not in tasks:
                tasks["collect"] = bar.add_task("collecting", total=max(1, left), info="", budget_s=p.budget_s)
            bar.update(tasks["collect"], completed=p.done - p.before if left else 1, info=_collect_info(p))

        def on_train(p: Any) -> None:
            if "train" not in tasks:
                tasks["train"] = bar.add_task(
                    "training", total=p.budget_s if p.budget_s < float("inf") else None, info=""
                )
            bar.update(
                tasks["train"],
                completed=p.elapsed_s,
                info=f"step {p.step}, loss {p.loss:.3f}, held-out top-1 {pct(p.heldout_top1)}"
                f" (step 2 {pct(p.heldout_top1_step2)}), {p.steps_per_s:.2f} steps/s",
            )

        try:
            yield on_stage, on_collect, on_train
            finish()
        finally:
            for t in tasks.values():
                bar.stop_task(t)


def train_summary(res: Any, sidecar: bool) -> None:
    r = res.train
    if not r.heldout_rows:
        err.print(f"nothing held out: no agreement measured ({r.steps} steps, {r.steps_per_s:.2f} steps/s)")
    else:
        err.print(
            f"held-out top-1 agreement with the trunk: step 1 {r.initial[0]:.1%} -> {r.final[0]:.1%}, "
            f"step 2 {r.initial[1]:.1%} -> {r.final[1]:.1%} ({r.steps} steps, {r.steps_per_s:.2f} steps/s)"
        )
    if r.fit is not None:
        err.print(
            f"on training rows: step 1 {r.fit[0]:.1%}, step 2 {r.fit[1]:.1%}"
            + (
                " (far above held-out: more data would help more than more steps)"
                if r.fit[0] - r.final[0] >= 0.15
                else ""
            )
        )
    err.print(
        f"wrote {res.out} ({res.out.stat().st_size / 1e6:.1f} MB)"
        + (f"; use it with: mtp-cli generate -m {res.trunk} -md {res.out} --spec-type mtp" if sidecar else "")
    )


def _drafting(spec_type: str) -> bool:
    from mtp_cli.drafters import drafting  # (not at import: `inspect` and --help load no llama.cpp)

    return drafting(spec_type)
