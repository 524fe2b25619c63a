"""GGUF commands: inspect, pack, strip, extract, adopt (gguf_tools only: they never load llama.cpp)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gguf_tools import ops
from gguf_tools.names import ADOPTABLE_ARCHS, HEAD_TYPES
from gguf_tools.report import INVALID, inspect_file
from gguf_tools.surgery import PackOptions
from mtp_cli.cli import options as opt
from mtp_cli.cli import render
from mtp_cli.cli.app import UserError, main


def _write(what: str, op: Callable[..., ops.WriteResult], *args: Any, **kw: Any) -> None:
    """Run a gguf_tools write with a progress bar, then say what was written."""
    with render.byte_progress(what) as cb:
        render.written(op(*args, progress=cb, **kw))


@main.command()
@click.argument("file", type=opt.PATH)
@opt.as_json
def inspect(file: Path, as_json: bool) -> None:
    """Architecture, trunk/head layout, head tensors and MTP readiness of a GGUF."""
    rep = inspect_file(file)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=2))
        if rep.verdict == INVALID:
            sys.exit(2)
        return
    if rep.verdict == INVALID:
        raise UserError(f"{rep.path}: {rep.advice}")
    render.inspect_report(rep)


@main.command()
@click.argument("trunk", type=opt.PATH)
@click.option(
    "--heads",
    "heads",
    required=True,
    type=opt.PATH,
    help="MTP sidecar GGUF, donor GGUF (trunk+head), or HF safetensors (file or folder).",
)
@opt.output
@click.option(
    "--head-type",
    type=click.Choice(["keep", *HEAD_TYPES]),
    default="keep",
    show_default=True,
    help="Convert float head tensors (norms stay F32, quantized tensors are kept).",
)
@click.option("--replace", is_flag=True, help="Swap out a head the trunk already has.")
@click.option("--force", is_flag=True, help="Graft even if the vocabularies differ.")
def pack(trunk: Path, heads: Path, out: Path, overwrite: bool, head_type: str, replace: bool, force: bool) -> None:
    """Graft MTP head tensors into TRUNK, leaving every trunk byte as it was."""
    _write("packing", ops.pack, trunk, heads, out, PackOptions(head_type, replace, force), overwrite)


@main.command()
@click.argument("file", type=opt.PATH)
@opt.output
def strip(file: Path, out: Path, overwrite: bool) -> None:
    """Drop the MTP head: a trunk-only GGUF."""
    _write("stripping", ops.strip, file, out, overwrite)


@main.command()
@click.argument("file", type=opt.PATH)
@opt.output
@click.option(
    "--head-only",
    is_flag=True,
    help="Only the head blocks: a small file for `pack`, without the embedding and output llama.cpp's -md needs.",
)
def extract(file: Path, out: Path, overwrite: bool, head_only: bool) -> None:
    """Write the MTP head alone, as a sidecar llama.cpp loads with -md."""
    _write("extracting", ops.extract, file, out, overwrite, head_only=head_only)


@main.command(
    help=f"""Re-express a {" / ".join(ADOPTABLE_ARCHS)} GGUF exactly as glm4moe, an architecture
    llama.cpp runs MTP for; a Llama 3.x one (rope_freqs: llama 3 rope scaling) as step35, always with
    its head slot.

    Every trunk byte is kept except llama's Q/K rows, which move whole (nothing is requantized)."""
)
@click.argument("file", type=opt.PATH)
@opt.output
@click.option(
    "--with-head-slot",
    is_flag=True,
    help="Also append a randomly initialised MTP head block (to train, or to test the MTP path).",
)
def adopt(file: Path, out: Path, overwrite: bool, with_head_slot: bool) -> None:
    _write("adopting", ops.adopt, file, out, with_head_slot, overwrite)
