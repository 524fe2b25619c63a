"""`mtp-cli generate`: decode with a drafter, verifying in batches; llama.cpp's flag spellings."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from mtp_cli.cli import gen_options as go
from mtp_cli.cli import options as opt
from mtp_cli.cli import render
from mtp_cli.cli.app import UserError, main
from mtp_cli.cli.llama_flags import chat_template, kv_and_sampling, llama_compat, load_of, placement


@main.command()
@opt.model(
    required=False,
    help="Target GGUF [default: the demo model, SmolLM2-135M-Instruct with the MTP head "
    "mtp-cli trained for it, built once into the user cache; with the chat template, and --temp 0, "
    "--repeat-penalty 1.1 and a sample prompt unless given].",
)
@click.option("-p", "--prompt", help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=opt.PATH, help="Read the prompt from a file (- : standard input).")
@click.option(
    "-n",
    "--n-predict",
    "n_predict",
    default=opt.DEFAULTS.n_predict,
    show_default=True,
    help="Tokens to generate (-1: until end of text).",
)
@go.context
@opt.threads
@opt.gpu_layers
@opt.seed
@go.sampling
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("-sys", "--system-prompt", "system", help="A system message for the chat template (with --chat).")
@opt.draft_model(help="MTP sidecar (--spec-type mtp) or draft model (--spec-type draft).")
@go.drafting
@click.option("--show-draft", is_flag=True, help="Colour the tokens that came from accepted drafts.")
@click.option("--json", "as_json", is_flag=True, help="Print the text and statistics as one JSON object.")
@click.option(
    "-cnv",
    "--conversation",
    is_flag=True,
    help="Chat in the terminal, turn after turn, with the chat template (-sys, -p: the first turn).",
)
@kv_and_sampling
@placement
@chat_template
@llama_compat
def generate(
    model: Path | None,
    prompt: str | None,
    prompt_file: Path | None,
    chat: bool,
    system: str | None,
    show_draft: bool,
    as_json: bool,
    conversation: bool,
    **opts: Any,
) -> None:
    """Generate text, drafting with an MTP head (or a draft model, or n-grams) and verifying in batches."""
    from mtp_cli.chat import chat_prompt
    from mtp_cli.runtime import Runtime
    from mtp_cli.speed.auto import AutoDraft

    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if conversation:
        return _conversation(model, prompt, prompt_file, system, show_draft, as_json, opts)
    if model is None:
        model, chat, prompt, opts = _demo_defaults(opts, prompt, prompt_file)
    text = _read_prompt(prompt, prompt_file)
    if system is not None and not chat:
        raise click.UsageError("-sys is a system message for the chat template: add --chat")
    base = go.gen_config(opts, model)
    with Runtime.load(model, load_of(opts, base.spec_type)[0]) as rt:
        res = AutoDraft(rt).resolve(base)
        if chat:
            text = chat_prompt(
                rt.chat_file,
                text,
                *rt.special_texts(),
                system=_text(system.encode("utf-8", "surrogateescape"), "-sys") if system else None,
            )
        gen = rt.generate(rt.tokenize(text, add_special=True, parse_special=chat), res.config, policy=res.policy)
        if res.note:
            render.note(f"note: {res.note}")
        pieces = _stream(gen, as_json, show_draft)
        stats = gen.stats
    _report(as_json, text, pieces, stats, res.controller, None if base.greedy else base.seed)
    if stats is not None and stats.stop_reason == "interrupted":
        sys.exit(130)  # as llama.cpp does, after the summary


def _report(as_json: bool, text: str, pieces: list[str], stats: Any, policy: Any, seed: int | None) -> None:
    """The JSON document, or the summary on stderr after the streamed text."""
    if as_json:
        doc: dict[str, Any] = {"prompt": text, "text": "".join(pieces), "stats": stats.to_dict() if stats else None}
        doc["seed"] = seed
        if policy is not None:
            doc["adaptive"] = policy.summary()
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo("")
    render.gen_stats(stats)
    if seed is not None:
        render.note(f"seed: {seed}")
    if policy is not None:
        render.note(policy.describe())


def _stream(gen: Any, as_json: bool, show_draft: bool) -> list[str]:
    """The generated pieces, echoed as they come unless as_json; Ctrl-C stops cleanly (still reported).
    --show-draft colours accepted drafts on a terminal only, and not under NO_COLOR."""
    pieces: list[str] = []
    colour = not as_json and _colour(show_draft)
    if show_draft and not as_json:
        render.note(
            "green: tokens from accepted drafts" if colour else "--show-draft: no colours (not a terminal, or NO_COLOR)"
        )
    try:
        for ev in gen:
            pieces.append(ev.text)
            if not as_json:
                styled = click.style(ev.text, fg="green") if colour and ev.source == "draft" else ev.text
                click.echo(styled, nl=False, color=colour or None)
    except KeyboardInterrupt:
        pass
    finally:
        gen.close()
    return pieces


def _terminal() -> bool:
    return sys.stdout.isatty()


def _colour(show_draft: bool) -> bool:
    return show_draft and _terminal() and not os.environ.get("NO_COLOR")


def _conversation(
    model: Path | None,
    prompt: str | None,
    prompt_file: Path | None,
    system: str | None,
    show_draft: bool,
    as_json: bool,
    opts: dict[str, Any],
) -> None:
    """-cnv: the runtime loaded once, then turn after turn (-p / -f: the first one)."""
    from mtp_cli.cli.conversation import converse
    from mtp_cli.runtime import Runtime
    from mtp_cli.speed.auto import AutoDraft

    if as_json:
        raise click.UsageError("-cnv is interactive: drop --json")
    if model is None:
        model, _, prompt, opts = _demo_defaults(opts, prompt, prompt_file, default_prompt=False)
    first = _read_prompt(prompt, prompt_file) if prompt is not None or prompt_file is not None else None
    sys_text = _text(system.encode("utf-8", "surrogateescape"), "-sys") if system else None
    base = go.gen_config(opts, model)
    if not base.greedy:
        render.note(f"seed: {base.seed}")
    with Runtime.load(model, load_of(opts, base.spec_type)[0]) as rt:
        res = AutoDraft(rt).resolve(base)
        if res.note:
            render.note(f"note: {res.note}")
        converse(rt, res.config, res.policy, sys_text, _colour(show_draft), first)


def _demo_defaults(
    opts: dict[str, Any], prompt: str | None, prompt_file: Path | None, default_prompt: bool = True
) -> tuple[Path, bool, str | None, dict[str, Any]]:
    """The demo model (built on first use), its chat, its prompt, and the options with its defaults
    for every one not given on the command line."""
    from mtp_cli.cli.demo_model import demo_file
    from mtp_cli.demo import DEMO_PROMPT

    path = demo_file()
    if prompt is None and prompt_file is None and default_prompt:
        prompt = DEMO_PROMPT
        render.note(f"prompt: {prompt}")
    return path, True, prompt, go.demo_settings(opts)


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt as text: -p as given, -f FILE or -f - (standard input) as UTF-8; a BOM dropped."""
    if prompt_file is not None:
        name = "standard input" if str(prompt_file) == "-" else str(prompt_file)
        try:
            raw = sys.stdin.buffer.read() if str(prompt_file) == "-" else prompt_file.read_bytes()
            return _text(raw, name)
        except OSError as e:
            raise UserError(f"{name}: cannot read the prompt: {e.strerror or e}") from None
    if prompt is None:
        raise click.UsageError("give a prompt with -p TEXT or -f FILE")
    # (argv bytes that are not UTF-8 arrive as lone surrogates: give them back as bytes to decode)
    return _text(prompt.encode("utf-8", "surrogateescape"), "-p")


def _text(raw: bytes, name: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{name}: the prompt is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    return text[1:] if text.startswith("\ufeff") else text
