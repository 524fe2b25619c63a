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
from gguf_tools.report import InspectReport, inspect_file
from gguf_tools.surgery import HEAD_TYPES, PackOptions
from mtp_cli import __version__

err = Console(stderr=True)
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
        except GGUFToolError as e:
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
