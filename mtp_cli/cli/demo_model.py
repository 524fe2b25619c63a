"""The demo model for the commands run without -m: built into the cache on first use, with a bar."""

from __future__ import annotations

from pathlib import Path

from mtp_cli.cli import render


def demo_file() -> Path:
    """The demo model's path (SmolLM2-135M-Instruct with the shipped head), built first if needed."""
    from mtp_cli.demo import demo_model, demo_path

    if demo_path().is_file():
        path = demo_model()
    else:
        with render.byte_progress("building the demo model (once)") as cb:
            path = demo_model(cb)
    render.note(f"demo model: {path}")
    return path


__all__ = ["demo_file"]
