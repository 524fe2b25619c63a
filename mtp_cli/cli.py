"""The command line: parse, call the library, render. The only place errors become exit codes."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from gguf_tools import ops
from gguf_tools.errors import GGUFToolError
from gguf_tools.gguf_file import open_gguf
from gguf_tools.report import InspectReport, inspect_file
from gguf_tools.surgery import HEAD_TYPES, PackOptions
from mtp_cli import __version__
from mtp_cli.chat import ChatTemplateError
from mtp_cli.llama_ext import LlamaError
from mtp_cli.runtime import RuntimeConfigError

err = Console(stderr=True, soft_wrap=True)
out = Console()


class UserError(click.ClickException):
    """Bad input or a refused operation: one line, exit code 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        err.print(f"[bold red]error:[/] {escape(self.format_message())}", highlight=False, soft_wrap=True)


class MtpGroup(click.Group):
    """Turns the library's typed errors into one-line messages, once, for every command."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (GGUFToolError, RuntimeConfigError, ChatTemplateError, LlamaError) as e:
            raise UserError(str(e)) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(130)


@click.group(cls=MtpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version")
@click.option("-v", "--verbose", is_flag=True, help="Log what the library does.")
def main(verbose: bool) -> None:
    """Multi-token prediction for local GGUF models."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=err, show_time=False, show_path=False)])


@contextmanager
def byte_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _out_option(f):
    f = click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (written atomically).")(f)
    return click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
                        help="Output GGUF (written to a temporary file, then renamed).")(f)


def _written(res: ops.WriteResult) -> None:
    err.print(f"wrote {res.path} ({res.tensors} tensors, {res.file_bytes / 1e6:.1f} MB)")


SPEC_CHOICES = ["none", "mtp", "draft-mtp", "draft", "ngram"]


class DraftNMax(click.ParamType):
    """--spec-draft-n-max: a number, "auto" (the tuned profile) or "adaptive"."""

    name = "N|auto|adaptive"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        v = str(value).strip().lower()
        try:
            return int(v)
        except ValueError:
            return v  # "auto", "adaptive", or refused in one line by GenConfig.validated


@main.command()
@click.option("-m", "--model", "model", type=click.Path(path_type=Path),
              help="Target GGUF [default: the demo model, SmolLM2-135M-Instruct with the MTP head mtp-cli "
                   "trained for it, built once into the user cache; with the chat template, and --temp 0, "
                   "--spec-type mtp, --spec-draft-n-max auto and a sample prompt unless given].")
@click.option("-p", "--prompt", help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.Path(path_type=Path), help="Read the prompt from a file.")
@click.option("-n", "--n-predict", default=-1, show_default=True, help="Tokens to generate (-1: until end of text).")
@click.option("-c", "--ctx-size", default=4096, show_default=True, help="Context size (0: the model's).")
@click.option("-t", "--threads", type=int, default=None, help="CPU threads (default: up to 4).")
@click.option("-ngl", "--n-gpu-layers", default=-1, show_default=True, help="Layers on the GPU (-1: all).")
@click.option("-s", "--seed", default=-1, show_default=True, help="Sampling seed (-1: random).")
@click.option("--temp", default=0.8, show_default=True, help="Temperature (0: greedy).")
@click.option("--top-k", default=40, show_default=True)
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--min-p", default=0.05, show_default=True)
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("-md", "--model-draft", type=click.Path(path_type=Path),
              help="MTP sidecar (--spec-type mtp) or draft model (--spec-type draft).")
@click.option("--spec-type", type=click.Choice(SPEC_CHOICES), default=None,
              help="Drafter: mtp (the model's head or -md sidecar), draft (-md model), ngram (prompt lookup). "
                   "[default: none; mtp with --spec-draft-n-max auto/adaptive]")
@click.option("--spec-draft-n-max", type=DraftNMax(), default=3, show_default=True,
              help="Most tokens drafted per step; auto: the setting `mtp-cli tune` saved for this model and "
                   "machine (adaptive when there is none); adaptive: chosen per step from measured acceptance "
                   "and costs.")
@click.option("--spec-draft-n-min", default=0, show_default=True, help="Drafts shorter than this are not verified.")
@click.option("--spec-draft-p-min", default=0.0, show_default=True, help="Stop drafting below this probability.")
@click.option("--show-draft", is_flag=True, help="Colour the tokens that came from accepted drafts.")
@click.option("--json", "as_json", is_flag=True, help="Print the text and statistics as one JSON object.")
def generate(model: Path, prompt: str | None, prompt_file: Path | None, chat: bool, show_draft: bool,
             as_json: bool, **opts) -> None:
    """Generate text, drafting with an MTP head (or a draft model, or n-grams) and verifying in batches."""
    from mtp_cli.chat import chat_prompt
    from mtp_cli.runtime import GenConfig, Runtime

    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if model is None:
        model, chat, prompt = _demo_defaults(opts, prompt, prompt_file)
    text = _read_prompt(prompt, prompt_file)
    spec = opts["spec_type"] or ("mtp" if isinstance(opts["spec_draft_n_max"], str) else "none")
    cfg = GenConfig(n_predict=opts["n_predict"], n_ctx=opts["ctx_size"], n_threads=opts["threads"],
                    n_gpu_layers=opts["n_gpu_layers"], spec_type=spec,
                    draft_model=str(opts["model_draft"]) if opts["model_draft"] else None,
                    draft_n_max=opts["spec_draft_n_max"], draft_n_min=opts["spec_draft_n_min"],
                    draft_p_min=opts["spec_draft_p_min"], temp=opts["temp"], top_k=opts["top_k"],
                    top_p=opts["top_p"], min_p=opts["min_p"], seed=opts["seed"]).validated()
    with Runtime.load(model, cfg) as rt:
        if chat:
            text = chat_prompt(open_gguf(model), text, *rt.special_texts())
        tokens = rt.tokenize(text, add_special=True, parse_special=chat)
        pieces: list[str] = []
        gen = rt.generate(tokens, cfg)
        if rt.note:
            err.print(f"[dim]note: {escape(rt.note)}[/]", highlight=False)
        try:
            for ev in gen:
                pieces.append(ev.text)
                if not as_json:
                    styled = click.style(ev.text, fg="green") if show_draft and ev.source == "draft" else ev.text
                    click.echo(styled, nl=False, color=True if show_draft else None)
        except KeyboardInterrupt:  # Ctrl-C while printing: stop cleanly, still report
            pass
        finally:
            gen.close()
        stats = rt.stats
        ctl = rt.controller if isinstance(cfg.draft_n_max, str) else None
    if as_json:
        doc = {"prompt": text, "text": "".join(pieces), "stats": stats.to_dict()}
        if ctl is not None:
            doc["adaptive"] = ctl.summary()
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo("")
        _render_stats(stats)
        if ctl is not None:
            err.print(f"[dim]{escape(ctl.describe())}[/]", highlight=False)


def _demo_defaults(opts: dict, prompt: str | None, prompt_file: Path | None) -> tuple[Path, bool, str | None]:
    """The demo model (built on first use) and its defaults for every option not given on the command line."""
    from click.core import ParameterSource

    from mtp_cli.demo import DEMO_PROMPT, demo_model, demo_path

    ctx = click.get_current_context()
    given = lambda name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE  # noqa: E731
    if demo_path().is_file():
        path = demo_model()
    else:
        with byte_progress("building the demo model (once)") as cb:
            path = demo_model(cb)
    if not given("spec_type"):
        opts["spec_type"] = "mtp"
    if not given("spec_draft_n_max") and opts["spec_type"] == "mtp":
        opts["spec_draft_n_max"] = "auto"
    if not given("temp"):
        opts["temp"] = 0.0
    if prompt is None and prompt_file is None:
        prompt = DEMO_PROMPT
        err.print(f"[dim]prompt: {escape(prompt)}[/]", highlight=False)
    err.print(f"[dim]demo model: {escape(str(path))}[/]", highlight=False)
    return path, True, prompt


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if prompt_file is not None:
        try:
            return prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{prompt_file}: cannot read the prompt: {getattr(e, 'strerror', None) or e}") from None
    if prompt is None:
        raise click.UsageError("give a prompt with -p TEXT or -f FILE")
    return prompt


STOP_WORDS = {"eog": "end of text", "n_predict": "-n reached", "ctx_full": "context full (raise -c)",
              "interrupted": "interrupted"}


def _render_stats(s) -> None:
    err.print(f"[dim]{s.n_prompt} prompt tokens at {s.prompt_tokens_per_second:.1f} t/s; "
              f"{s.n_tokens} generated at {s.tokens_per_second:.1f} t/s; stop: "
              f"{STOP_WORDS.get(s.stop_reason, s.stop_reason)}[/]", highlight=False)
    if s.spec_type != "none" and not s.n_drafted:
        err.print(f"[dim]{s.spec_type}: nothing drafted was verified ({s.n_verify} plain steps)[/]", highlight=False)
    elif s.spec_type != "none":
        by_pos = " ".join(f"{a:.0%}" for a in s.acceptance_by_pos)
        err.print(f"[dim]{s.spec_type}: {s.n_verify} verify passes, {s.tokens_per_pass:.2f} tokens/pass, "
                  f"acceptance {s.acceptance:.1%} ({s.n_accepted}/{s.n_drafted}), "
                  f"{s.mean_accepted_per_pass:.2f} accepted/pass, by position: {by_pos}[/]", highlight=False)


def _prompt_texts(prompts: Path | None) -> list[str] | None:
    from mtp_cli.measure import read_prompts

    return read_prompts(prompts) if prompts is not None else None


@main.command()
@click.option("-m", "--model", "model", required=True, type=click.Path(path_type=Path),
              help="Target GGUF (with an MTP head).")
@click.option("-md", "--model-draft", type=click.Path(path_type=Path), help="MTP sidecar.")
@click.option("--prompts", type=click.Path(path_type=Path), help="Prompts, one per line [default: built-in].")
@click.option("--budget", type=float, default=60.0, show_default=True, help="Seconds to spend measuring.")
@click.option("--n-max", type=int, default=8, show_default=True, help="Largest draft length tried.")
@click.option("-t", "--threads", type=int, default=None, help="CPU threads (default: up to 4).")
@click.option("-ngl", "--n-gpu-layers", default=-1, show_default=True, help="Layers on the GPU (-1: all).")
@click.option("--no-save", is_flag=True, help="Measure and report only; do not save the profile.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def tune(model: Path, model_draft: Path | None, prompts: Path | None, budget: float, n_max: int, threads: int | None,
         n_gpu_layers: int, no_save: bool, as_json: bool) -> None:
    """Find the fastest draft setting for MODEL on this machine (possibly: off) and save it as the
    profile `--spec-draft-n-max auto` uses. Also shows the machine's cost model: why MTP pays here, or not."""
    from rich.live import Live

    from mtp_cli.tune import tune as run_tune

    texts = _prompt_texts(prompts)
    with Live(console=err, refresh_per_second=8, transient=True) as live:
        def progress(ev) -> None:
            live.update(_tune_table(ev.result, ev.message))

        res = run_tune(model, model_draft, prompts=texts, budget=budget, n_threads=threads, n_gpu_layers=n_gpu_layers,
                       n_max=n_max, progress=progress, save=not no_save)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    out.print(_tune_table(res, f"done in {res.elapsed:.0f} s ({res.rungs} rungs)"))
    out.print(_tune_bars(res))
    if res.cost is not None:
        out.print(_cost_table(res))
    best = res.best
    verdict = ("off: plain decoding is fastest here" if best.spec_type == "none" else
               f"{best.name}: {best.ratio:.2f}x plain decoding")
    out.print(f"[bold]best:[/] {verdict}")
    if res.profile_path is not None:
        out.print(f"saved profile {res.profile.key} to {res.profile_path}; use it with "
                  f"`mtp-cli generate -m {model} --spec-draft-n-max auto`", highlight=False)


def _tune_table(res, caption: str) -> Table:
    t = Table("setting", "status", "predicted", "tok/s", "x off", "accept", "repeats", box=None, header_style="bold",
              caption=f"{caption}  [{res.elapsed:.0f}/{res.budget:.0f} s]", caption_justify="left")
    for c in res.candidates:
        tps = c.tokens_per_second
        style = "bold green" if c.status == "best" else ("dim" if c.status in ("pruned", "dropped") else None)
        t.add_row(c.name, c.status, "-" if c.predicted is None else f"{c.predicted:.2f}x",
                  "-" if tps is None else f"{tps:.1f}", "-" if c.ratio is None else f"{c.ratio:.2f}",
                  "-" if c.acceptance is None else f"{c.acceptance:.0%}",
                  " ".join(f"{x:.0f}" for x in c.runs) or "-", style=style)
    return t


def _tune_bars(res) -> Table:
    from rich.bar import Bar

    measured = sorted((c for c in res.candidates if c.tokens_per_second), key=lambda c: -c.tokens_per_second)
    top = measured[0].tokens_per_second if measured else 1.0
    t = Table("setting", "tokens/s (last rung measured)", "", "x off", box=None, header_style="bold",
              title="tokens per second by setting", title_justify="left")
    for c in measured:
        t.add_row(c.name, Bar(top, 0, c.tokens_per_second, width=40, color="green" if c.status == "best" else "blue"),
                  f"{c.tokens_per_second:.1f}", "-" if c.ratio is None else f"{c.ratio:.2f}",
                  style="bold" if c.status == "best" else None)
    return t


def _cost_table(res) -> Table:
    cm = res.cost
    acc = res.acceptance_by_pos
    t = Table("N", "v(N)", "drafts", "o(N)", "needs tok/step", "needs alpha", "predicted", box=None,
              header_style="bold", title_justify="left",
              title=(f"cost model: T = {cm.t_ms:.3g} ms per plain token (llama_decode); one head row c = "
                     f"{cm.draft:.2f} T; plain decoding's overhead {cm.overhead_plain:.2f} T"),
              caption=("a step at N costs v(N) (verify N+1 tokens) + drafts (c(E) + (N-1) c: the first head decode "
                       "carries the E-1 tokens accepted last step) + o(N) (Python); MTP pays when tokens per step "
                       "E exceed that / (1 + plain overhead). 'needs alpha': the same for i.i.d. per-token "
                       "acceptance (-: not even at 100%). 'predicted': the speed ratio with the acceptance measured "
                       f"at N={cm.n_max} ({' '.join(f'{a:.2f}' for a in acc[:8])})"),
              caption_justify="left")
    for n in range(1, cm.n_max + 1):
        a = cm.break_even_alpha(n)
        e = cm.break_even_tokens(n)
        t.add_row(str(n), f"{cm.verify[n]:.2f}", f"{cm.draft_cost(n, min(e, n + 1.0)):.2f}", f"{cm.overhead_at(n):.2f}",
                  f"{e:.2f}", "-" if a is None else f"{a:.2f}", f"{cm.ratio(n, acc):.2f}x")
    return t


@main.command()
@click.option("-m", "--model", "model", required=True, type=click.Path(path_type=Path), help="Target GGUF.")
@click.option("-md", "--model-draft", type=click.Path(path_type=Path), help="MTP sidecar.")
@click.option("--prompts", type=click.Path(path_type=Path), help="Prompts, one per line [default: built-in].")
@click.option("-n", "--n-predict", default=64, show_default=True, help="Tokens generated per prompt.")
@click.option("--repeats", default=3, show_default=True, help="Repeats per setting (the median is shown).")
@click.option("-t", "--threads", type=int, default=None, help="CPU threads (default: up to 4).")
@click.option("-ngl", "--n-gpu-layers", default=-1, show_default=True, help="Layers on the GPU (-1: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def bench(model: Path, model_draft: Path | None, prompts: Path | None, n_predict: int, repeats: int,
          threads: int | None, n_gpu_layers: int, as_json: bool) -> None:
    """none, ngram, mtp at N = 1..4, auto and adaptive side by side: same prompts, greedy, medians of repeats."""
    from mtp_cli.bench import bench as run_bench

    if n_predict < 1 or repeats < 1:
        raise UserError("-n and --repeats must be at least 1")
    texts = _prompt_texts(prompts)
    with Progress(TextColumn("[bold]bench"), BarColumn(), TextColumn("{task.description}"), console=err,
                  transient=True) as bar:
        task = bar.add_task("", total=None)

        def progress(ev) -> None:
            bar.update(task, completed=ev.done, total=ev.total, description=ev.message)

        res = run_bench(model, model_draft, prompts=texts, n_threads=threads, n_gpu_layers=n_gpu_layers,
                        n_predict=n_predict, repeats=repeats, progress=progress)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    t = Table("setting", "tok/s", "x none", "accept", "tok/pass", "spread", "", box=None, header_style="bold",
              caption=f"{res.prompts} prompts x {res.n_predict} tokens, greedy, median of {res.repeats}",
              caption_justify="left")
    for r in res.rows:
        if r.result is None:
            t.add_row(r.name, "-", "-", "-", "-", "-", r.detail, style="dim")
            continue
        s = r.result.stats
        drafting = s.spec_type != "none" and s.n_drafted
        t.add_row(r.name, f"{s.tokens_per_second:.1f}", f"{r.ratio:.2f}" if r.ratio else "-",
                  f"{s.acceptance:.0%}" if drafting else "-", f"{s.tokens_per_pass:.2f}",
                  f"{r.result.spread:.1%}", r.detail)
    out.print(t)


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def inspect(file: Path, as_json: bool) -> None:
    """Architecture, trunk/head layout, head tensors and MTP readiness of a GGUF."""
    rep = inspect_file(file)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=2))
        return
    _render_report(rep)


def _render_report(rep: InspectReport) -> None:
    t = Table.grid(padding=(0, 2))
    t.add_row("file", f"{rep.path} ({rep.file_bytes / 1e6:.1f} MB)")
    t.add_row("architecture", rep.arch + (f"  ({rep.name})" if rep.name else ""))
    t.add_row("blocks", f"{rep.block_count} = {rep.trunk_blocks} trunk + {rep.head_blocks} head")
    t.add_row("n_embd / n_vocab", f"{rep.n_embd} / {rep.n_vocab}")
    t.add_row("tensors", f"{rep.tensor_count}: " + ", ".join(f"{n} {k}" for k, n in rep.tensor_types.items()))
    t.add_row("head", f"{len(rep.head_tensors)} tensors, {rep.head_bytes / 1e6:.2f} MB ({rep.head_share:.1%} of the file)")
    t.add_row("verdict", f"[bold]{rep.verdict}[/]")
    t.add_row("", rep.advice)
    out.print(t)
    if rep.head_tensors:
        ht = Table("head tensor", "type", "shape", "bytes", box=None, header_style="bold")
        for h in rep.head_tensors:
            ht.add_row(h.name, h.type, "x".join(map(str, h.shape)), f"{h.bytes:,}")
        out.print(ht)


@main.command()
@click.argument("trunk", type=click.Path(path_type=Path))
@click.option("--heads", "heads", required=True, type=click.Path(path_type=Path),
              help="MTP sidecar GGUF, donor GGUF (trunk+head), or HF safetensors (file or folder).")
@_out_option
@click.option("--head-type", type=click.Choice(["keep", *HEAD_TYPES]), default="keep", show_default=True,
              help="Convert float head tensors (norms stay F32, quantized tensors are kept).")
@click.option("--replace", is_flag=True, help="Swap out a head the trunk already has.")
@click.option("--force", is_flag=True, help="Graft even if the vocabularies differ.")
def pack(trunk: Path, heads: Path, out: Path, overwrite: bool, head_type: str, replace: bool, force: bool) -> None:
    """Graft MTP head tensors into TRUNK, leaving every trunk byte as it was."""
    with byte_progress("packing") as cb:
        res = ops.pack(trunk, heads, out, PackOptions(head_type, replace, force), overwrite, cb)
    _written(res)


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@_out_option
def strip(file: Path, out: Path, overwrite: bool) -> None:
    """Drop the MTP head: a trunk-only GGUF."""
    with byte_progress("stripping") as cb:
        res = ops.strip(file, out, overwrite, cb)
    _written(res)


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@_out_option
@click.option("--head-only", is_flag=True,
              help="Only the head blocks: a small file for `pack`, without the embedding and output llama.cpp's "
                   "-md needs.")
def extract(file: Path, out: Path, overwrite: bool, head_only: bool) -> None:
    """Write the MTP head alone, as a sidecar llama.cpp loads with -md."""
    with byte_progress("extracting") as cb:
        res = ops.extract(file, out, overwrite, cb, head_only)
    _written(res)


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@_out_option
@click.option("--with-head-slot", is_flag=True,
              help="Also append a randomly initialised MTP head block (to train, or to test the MTP path).")
def adopt(file: Path, out: Path, overwrite: bool, with_head_slot: bool) -> None:
    """Re-express a llama / qwen2 / qwen3 GGUF exactly as glm4moe, an architecture llama.cpp runs MTP for.

    Every trunk byte is kept except llama's Q/K rows, which move whole (nothing is requantized)."""
    with byte_progress("adopting") as cb:
        res = ops.adopt(file, out, with_head_slot, overwrite, cb)
    _written(res)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@_out_option
@click.option("--text", "texts", multiple=True, type=click.Path(path_type=Path),
              help="Text file for teacher-forced passes (repeatable; documents split at two blank lines).")
@click.option("--prompts", type=click.Path(path_type=Path),
              help="Prompts, one per line, answered greedily by the trunk (chat template applied when the model has one).")
@click.option("--minutes", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="The whole run: collecting data (at most --collect-share of it), then training. 0: export the "
                   "checkpoint in the work folder again.")
@click.option("--collect-share", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Share of --minutes spent collecting; what is left uncollected is collected by the next run "
                   "with the same work folder.")
@click.option("--head-type", type=click.Choice(["f16", "q8_0"]), default="f16", show_default=True,
              help="Type of the head block's matrices in OUT.")
@click.option("--own-output", type=click.Choice(["q4_0", "q8_0", "none"]), default="q4_0", show_default=True,
              help="Give the head its own full-vocabulary output matrix of this type (a copy of the trunk's; "
                   "Q4_0 halved the draft step on SmolLM2) or none (read the trunk's).")
@click.option("--fit-output", type=click.Choice(["trunk", "q4_0", "q8_0"]), default=None,
              help="Output matrix the head is trained against [default: the one OUT drafts with]; q4_0 with "
                   "--own-output none for a head to be packed with its own Q4_0 copy later.")
@click.option("--sidecar", is_flag=True, help="Write OUT as an MTP-only sidecar (use it with -md) instead of trunk + head.")
@click.option("-s", "--seed", type=int, default=0, show_default=True)
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="Threads [default: cores, up to 4].")
@click.option("--max-prompts", type=int, default=None, help="Use at most this many prompts.")
@click.option("--init", type=click.Choice(["random", "trunk", "slot"]), default="random", show_default=True,
              help="Start from random weights, the trunk's last block, or the file's head slot.")
@click.option("--work", type=click.Path(path_type=Path), default=None,
              help="Work folder (data, checkpoint, adopted trunk) [default: OUT.train]; rerun to resume.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Peak learning rate [default: 1.5e-3; not remembered by a resumed run]. The cosine decay "
                   "(to 0.1 x this) spans every run of the checkpoint, so a resumed run starts partway down it; "
                   "a lower --lr anneals a trained head.")
def train(model: Path, out: Path, overwrite: bool, texts: tuple[Path, ...], prompts: Path | None, minutes: float,
          collect_share: float, head_type: str, own_output: str, fit_output: str | None, sidecar: bool, seed: int, threads: int, max_prompts: int | None, init: str,
          work: Path | None, lr: float | None) -> None:
    """Train an MTP head for MODEL's frozen trunk and write OUT (needs: pip install 'mtp-cli[train]').

    MODEL: a glm4moe trunk (adopted or native, with or without a head slot), or a llama / qwen2 /
    qwen3 GGUF, adopted on the fly (OUT is then the adopted model plus the head). Data: the trunk's
    own greedy answers to --prompts and teacher-forced passes over --text (the built-in prompts when
    neither is given), collected through llama.cpp. Held-out top-1 agreement with the trunk is shown
    while training."""
    from rich.progress import TimeElapsedColumn

    from mtp_cli.llama_ext import default_threads
    from mtp_cli.train.pipeline import TrainJob, run_train

    job = TrainJob(model=model, out=out, texts=texts, prompts=prompts, minutes=minutes, collect_share=collect_share,
                   head_type=head_type, own_output=None if own_output == "none" else own_output, fit_output=fit_output,
                   sidecar=sidecar, seed=seed, work=work, init=init, max_prompts=max_prompts,
                   n_threads=threads if threads is not None else default_threads(),
                   overwrite=overwrite, lr=lr)
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=err, transient=False) as bar:
        tasks: dict[str, int] = {}

        def on_collect(p) -> None:
            if "collect" not in tasks:
                tasks["collect"] = bar.add_task("collecting", total=p.total, info="")
            bar.update(tasks["collect"], completed=p.done, total=p.total,
                       info=f"{p.rows} rows, trunk {p.tokens_per_s:.0f} tok/s, answers {p.gen_tokens_per_s:.0f} tok/s")

        def on_train(p) -> None:
            if "train" not in tasks:
                tasks["train"] = bar.add_task("training", total=p.budget_s if p.budget_s < float("inf") else None, info="")
            bar.update(tasks["train"], completed=p.elapsed_s,
                       info=f"step {p.step}, loss {p.loss:.3f}, held-out top-1 {pct(p.heldout_top1)}"
                            f" (step 2 {pct(p.heldout_top1_step2)}), {p.steps_per_s:.2f} steps/s")

        res = run_train(job, on_stage=lambda s: err.print(f"[bold]{s}[/]") if s == "export" else None,
                        on_collect=on_collect, on_train=on_train)
    r = res.train
    err.print(f"held-out top-1 agreement with the trunk: step 1 {r.initial[0]:.1%} -> {r.final[0]:.1%}, "
              f"step 2 {r.initial[1]:.1%} -> {r.final[1]:.1%} ({r.steps} steps, {r.steps_per_s:.2f} steps/s)")
    if r.fit is not None:
        err.print(f"on training rows: step 1 {r.fit[0]:.1%}, step 2 {r.fit[1]:.1%}"
                  + (" (far above held-out: more data would help more than more steps)"
                     if r.fit[0] - r.final[0] >= 0.15 else ""))
    err.print(f"wrote {res.out} ({res.out.stat().st_size / 1e6:.1f} MB)"
              + (f"; use it with: mtp-cli generate -m {res.trunk} -md {res.out} --spec-type mtp" if sidecar else ""))
