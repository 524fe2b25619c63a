"""The generation options generate and serve share (the context, the sampler, the drafter), and
how they become a GenConfig and a draft length."""

from __future__ import annotations

import json
import secrets
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from gguf_tools.errors import spelled
from mtp_cli.cli.app import MtpCommand
from mtp_cli.cli.options import DEFAULTS as _D
from mtp_cli.cli.options import stack
from mtp_cli.config import GenConfig, parse_logit_bias
from mtp_cli.errors import ConfigError


class SpecTypeParam(click.ParamType):
    """--spec-type: a spec type of the drafter registry (read when parsing, so help stays light)."""

    name = "spec type"

    def _names(self) -> list[str]:
        from mtp_cli import drafters

        return drafters.names()

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "[" + "|".join(self._names()) + "][,...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from mtp_cli import drafters
        from mtp_cli.errors import ConfigError

        v = str(value).strip().lower()
        try:
            return drafters.get(v).name  # (a chain, comma-separated, in its canonical order)
        except ConfigError as e:  # (its reason: an unknown name, or a chain that cannot be)
            self.fail(f"{e}; the spec types are {', '.join(self._names())}, or several comma-separated", param, ctx)


class DraftNParam(click.ParamType):
    """--spec-draft-n-max: a number, "auto" (the tuned profile) or "adaptive" (checked by the
    library: speed.auto.parse_draft_n, whose refusal names the flag in one line)."""

    name = "N|auto|adaptive"


class SpecTypeOption(click.Option):
    """--spec-type, whose help lists the registry's drafters (built when help is shown)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from mtp_cli import drafters

        cmd = ctx.command
        spell = cmd.flag_of if isinstance(cmd, MtpCommand) else (lambda name: name)
        kinds = "; ".join(
            f"{c.name}{' (' + ', '.join(c.aliases) + ')' if c.aliases else ''}: {spelled(c.summary, spell)}"
            for c in drafters.REGISTRY.values()
        )
        self.help = (
            f"Drafter, or several comma-separated (the first that proposes drafts, text lookups first, as "
            f"llama.cpp chains them). {kinds}. [default: lookup, chained with the model's MTP head (or "
            f"{spell('draft_model')}) when it has one]"
        )
        return super().get_help_record(ctx)


flash_attn = click.option(
    "-fa",
    "--flash-attn",
    "flash_attn",
    type=click.Choice(["on", "off", "auto"]),
    default="auto",
    show_default=True,
    callback=lambda ctx, param, v: {"on": True, "off": False}.get(v),
    help="Flash attention. auto: where attention runs on the CPU with an unquantized KV cache, off for one "
    "sequence (llama.cpp's CPU kernel: 1.7x slower per token at 256 positions, 2.2x at 1024) and measured on "
    "this CPU for several (serve -np N); else llama.cpp's auto.",
)
context = stack(
    click.option(
        "-c", "--ctx-size", "n_ctx", default=_D.n_ctx, show_default=True, help="Context size (0: the model's)."
    ),
    click.option(
        "-b",
        "--batch-size",
        "n_batch",
        type=click.IntRange(min=1),
        default=_D.n_batch,
        show_default=True,
        help="Prompt chunk size.",
    ),
    flash_attn,
)
sampling = stack(
    click.option("--temp", default=_D.temp, show_default=True, help="Temperature (0: greedy)."),
    click.option("--top-k", "top_k", default=_D.top_k, show_default=True),
    click.option("--top-p", "top_p", default=_D.top_p, show_default=True),
    click.option("--min-p", "min_p", default=_D.min_p, show_default=True),
)
drafting = stack(
    click.option("--spec-type", "spec_type", cls=SpecTypeOption, type=SpecTypeParam(), default=None),
    click.option(
        "--spec-draft-n-max",
        "draft_n_max",
        type=DraftNParam(),
        default="auto",
        show_default=True,
        help="Most tokens drafted per step; auto: the setting `mtp-cli tune` saved for this model and "
        "machine (adaptive when there is none); adaptive: chosen per step from measured acceptance "
        "and costs. The lookup sizes its own drafts from its matches (up to 32, 16 on a recurrent "
        "model; a number caps it too).",
    ),
    click.option(
        "--spec-draft-n-min",
        "draft_n_min",
        default=_D.draft_n_min,
        show_default=True,
        help="Drafts shorter than this are not verified.",
    ),
    click.option(
        "--spec-draft-p-min",
        "draft_p_min",
        default=_D.draft_p_min,
        show_default=True,
        help="Stop drafting below this probability.",
    ),
)


def gen_config(opts: dict[str, Any], model: Path) -> GenConfig:
    """The generation settings the options say (a random seed drawn, to be reported; a draft length
    of auto or adaptive as the config's draft_mode, resolved against the loaded model; no spec type
    given: the model's default drafting, speed.auto.default_spec)."""
    from mtp_cli.speed.auto import default_spec, parse_draft_n

    values = {f.name: opts[f.name] for f in fields(GenConfig) if f.name in opts}
    mode, n = parse_draft_n(opts["draft_n_max"])
    values.update(
        logit_bias=parse_logit_bias(opts.get("logit_bias") or (), "logit_bias"),
        grammar=grammar_of(opts),
        draft_mode=mode,
        draft_n_max=_D.draft_n_max if n is None else n,
        spec_type=opts["spec_type"] or default_spec(model, opts.get("draft_model")),
    )
    if values.get("seed", _D.seed) == -1 and values.get("temp", _D.temp) > 0:
        values["seed"] = secrets.randbits(31)  # random, but said: the run can be repeated with -s
    from mtp_cli import drafters

    return drafters.validated(GenConfig(**values))  # (checked before anything loads)


def grammar_of(opts: dict[str, Any]) -> str | None:
    """The GBNF the options give: --grammar, --grammar-file, or -j / -jf's JSON schema turned into
    one (llama-server's conversion); at most one of them."""
    given = [k for k in ("grammar", "grammar_file", "json_schema", "json_schema_file") if opts.get(k)]
    if len(given) > 1:
        raise click.UsageError("give one of --grammar, --grammar-file, -j and -jf")
    if not given:
        return None
    key = given[0]
    text = _read(opts[key], key) if key.endswith("_file") else str(opts[key])
    if key.startswith("grammar"):
        return text
    from mtp_cli import schemas

    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"`{key}`: not JSON: {e}") from None
    return schemas.checked(doc, key)


def _read(path: Path, name: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"`{name}` {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None


DEMO_REPEAT_PENALTY = 1.1


def demo_settings(opts: dict[str, Any]) -> dict[str, Any]:
    """The options with the demo model's defaults for those not given on the command line (nor by
    LLAMA_ARG_*): greedy, llama.cpp's classic repeat penalty (1.1 over the last 64 tokens: a 135M
    model's greedy answer can loop, and did, once AMX's kernels flipped a near-tie in the demo
    prompt's, until the context was full); drafting as for any model (lookup and the MTP head, N
    auto). Drafting keeps the penalized output exact."""
    ctx = click.get_current_context()
    given = lambda name: ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)  # noqa: E731
    out = dict(opts)
    if not given("temp"):
        out["temp"] = 0.0
    if not given("repeat_penalty"):
        out["repeat_penalty"] = DEMO_REPEAT_PENALTY
    return out


__all__ = ["context", "sampling", "drafting", "gen_config", "demo_settings", "SpecTypeParam", "DraftNParam"]
