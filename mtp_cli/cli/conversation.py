"""`generate -cnv`: an interactive chat in the terminal, each turn decoding only its own new tokens."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import click

from mtp_cli.chat import Conversation
from mtp_cli.cli import render
from mtp_cli.config import GenConfig
from mtp_cli.policy import DraftPolicy

HELP = "conversation: /exit or end of input (Ctrl-D) to leave; Ctrl-C stops an answer (at the prompt: leaves)"


def converse(
    rt: Any,
    cfg: GenConfig,
    policy: Optional[DraftPolicy],
    system: Optional[str],
    colour: bool,
    first: Optional[str] = None,
) -> None:
    """Read a line, answer it with the model's chat template and the history kept in memory; repeat."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    bos, eos = rt.special_texts()
    conv = Conversation(
        rt.file, bos, eos, lambda text, add: rt.tokenize(text, add_special=add, parse_special=True), system
    )
    render.note(HELP)
    line = first
    while True:
        if line is None:
            try:
                line = input("> ")
            except EOFError:
                click.echo("")
                return
        if line.strip() == "/exit":
            return
        if line.strip():
            _answer(rt, conv, conv.ask(line), cfg, policy, colour)
        line = None


def _answer(rt: Any, conv: Conversation, prompt: list[int], cfg: GenConfig, policy: Any, colour: bool) -> None:
    """Stream one answer (Ctrl-C stops it: what came so far stays in the history), then its summary."""
    gen = rt.generate(prompt, cfg, policy=policy, reuse=True)  # (a history past the context: one line, -c)
    tokens: list[int] = []
    pieces: list[str] = []
    try:
        for ev in gen:
            tokens.append(ev.token)
            pieces.append(ev.text)
            text = click.style(ev.text, fg="green") if colour and ev.source == "draft" else ev.text
            click.echo(text, nl=False, color=colour or None)
    except KeyboardInterrupt:
        pass  # (a Ctrl-C outside the loop's decode: the answer stops here all the same)
    finally:
        gen.close()
    click.echo("")
    render.gen_stats(rt.stats)
    conv.answered("".join(pieces), tokens)
