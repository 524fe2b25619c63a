"""Options several commands share, defined once. Destinations are the library's parameter names
(GenConfig's fields, the tune/bench/train arguments), so values pass through by name and the
library's error messages name them back (`n_threads` -> -t)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from mtp_cli.config import GenConfig, LoadConfig

F = TypeVar("F", bound=Callable[..., Any])
DEFAULTS = GenConfig()  # the library's defaults are the flags' (one place for each)
PATH = click.Path(path_type=Path)


def stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(f: F) -> F:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def model(required: bool = True, help: str = "Target GGUF.") -> Callable[[F], F]:
    return click.option("-m", "--model", "model", required=required, type=PATH, help=help)


def draft_model(help: str = "MTP sidecar.") -> Callable[[F], F]:
    return click.option("-md", "--model-draft", "draft_model", type=PATH, help=help)


threads = click.option(
    "-t",
    "--threads",
    "n_threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads [default: cores, up to 4].",
)
gpu_layers = click.option(
    "-ngl",
    "--n-gpu-layers",
    "n_gpu_layers",
    default=LoadConfig.n_gpu_layers,
    show_default=True,
    help="Layers on the GPU (-1: all).",
)
prompts = click.option("--prompts", type=PATH, help="Prompts, one per line [default: built-in].")
as_json = click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
seed = click.option("-s", "--seed", default=DEFAULTS.seed, show_default=True, help="Sampling seed (-1: random).")

output = stack(
    click.option(
        "-o",
        "--output",
        "out",
        required=True,
        type=PATH,
        help="Output GGUF (written to a temporary file, then renamed).",
    ),
    click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (written atomically)."),
)


def read_prompt_texts(path: Path | None) -> list[str] | None:
    from mtp_cli.prompts import read_prompts

    return read_prompts(path) if path is not None else None


__all__ = [
    "model",
    "draft_model",
    "threads",
    "gpu_layers",
    "prompts",
    "as_json",
    "seed",
    "output",
    "stack",
    "PATH",
    "read_prompt_texts",
]
