"""`make demo`: graft an MTP head into a trunk-only GGUF and show what changed, on tiny models built here.

Until the embedded SmolLM2 demo lands, this shows the surgery end to end: a trunk-only file, its
MTP sidecar, the packed result, and llama.cpp loading the packed file with its head.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from gguf_tools.factory import tiny_model_set
from mtp_cli.cli import main as cli


def run(args: list[str]) -> None:
    click.echo(f"\n$ mtp-cli {' '.join(args)}", err=True)
    try:
        cli.main(args, standalone_mode=False)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)


def demo() -> None:
    with tempfile.TemporaryDirectory(prefix="mtp-demo.") as d:
        s = tiny_model_set(Path(d), "qwen35", "structured", "q8_0")
        out = str(Path(d) / "packed.gguf")
        run(["inspect", str(s["trunk"])])
        run(["inspect", str(s["sidecar"])])
        run(["pack", str(s["trunk"]), "--heads", str(s["sidecar"]), "-o", out])
        run(["inspect", out])
        from mtp_cli import llama_ext as lx

        lx.quiet_logs()
        model = lx.load_model(out, load_mtp=True)
        click.echo(f"\nllama.cpp loaded {Path(out).name} with {lx.n_layer_nextn(model)} MTP head block(s)")
        lx.free_model(model)


if __name__ == "__main__":
    demo()
