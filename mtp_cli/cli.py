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


@main.command()
@click.option("-m", "--model", "model", required=True, type=click.Path(path_type=Path), help="Target GGUF.")
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
@click.option("--spec-type", type=click.Choice(SPEC_CHOICES), default="none", show_default=True,
              help="Drafter: mtp (the model's head or -md sidecar), draft (-md model), ngram (prompt lookup).")
@click.option("--spec-draft-n-max", default=3, show_default=True, help="Most tokens drafted per step.")
@click.option("--spec-draft-n-min", default=0, show_default=True, help="Drafts shorter than this are not verified.")
@click.option("--spec-draft-p-min", default=0.0, show_default=True, help="Stop drafting below this probability.")
@click.option("--show-draft", is_flag=True, help="Colour the tokens that came from accepted drafts.")
@click.option("--json", "as_json", is_flag=True, help="Print the text and statistics as one JSON object.")
def generate(model: Path, prompt: str | None, prompt_file: Path | None, chat: bool, show_draft: bool,
             as_json: bool, **opts) -> None:
    """Generate text, drafting with an MTP head (or a draft model, or n-grams) and verifying in batches."""
    from mtp_cli.chat import chat_prompt
    from mtp_cli.runtime import GenConfig, Runtime

    text = _read_prompt(prompt, prompt_file)
    cfg = GenConfig(n_predict=opts["n_predict"], n_ctx=opts["ctx_size"], n_threads=opts["threads"],
                    n_gpu_layers=opts["n_gpu_layers"], spec_type=opts["spec_type"],
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
    if as_json:
        click.echo(json.dumps({"prompt": text, "text": "".join(pieces), "stats": stats.to_dict()}, indent=2))
    else:
        click.echo("")
        _render_stats(stats)


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
    if s.spec_type != "none":
        by_pos = " ".join(f"{a:.0%}" for a in s.acceptance_by_pos)
        err.print(f"[dim]{s.spec_type}: {s.n_verify} verify passes, {s.tokens_per_pass:.2f} tokens/pass, "
                  f"acceptance {s.acceptance:.1%} ({s.n_accepted}/{s.n_drafted}), "
                  f"{s.mean_accepted_per_pass:.2f} accepted/pass, by position: {by_pos}[/]", highlight=False)


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
def extract(file: Path, out: Path, overwrite: bool) -> None:
    """Write the MTP head alone, as a sidecar llama.cpp loads with -md."""
    with byte_progress("extracting") as cb:
        res = ops.extract(file, out, overwrite, cb)
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
