"""`generate -cnv`: an interactive chat in the terminal, each turn decoding only its own new tokens."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import click

from mtp_cli.cli import render
from mtp_cli.config import GenConfig
from mtp_cli.policy import DraftPolicy
from mtp_cli.session import Message, Session

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
    session = Session(rt)
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
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
            messages.append({"role": "user", "content": line})
            messages.append({"role": "assistant", "content": _answer(session, messages, cfg, policy, colour)})
        line = None


def _answer(session: Session, messages: list[Message], cfg: GenConfig, policy: Any, colour: bool) -> str:
    """Stream one answer (Ctrl-C stops it: what came so far stays in the history), then its summary."""
    gen = session.generate(session.chat(messages), cfg, policy)  # (a history past the context: one line, -c)
    try:
        for ev in gen:
            text = click.style(ev.text, fg="green") if colour and ev.source == "draft" else ev.text
            click.echo(text, nl=False, color=colour or None)
    except KeyboardInterrupt:
        pass  # (a Ctrl-C outside the loop's decode: the answer stops here all the same)
    finally:
        gen.close()
    click.echo("")
    render.gen_stats(gen.stats)
    return gen.text
