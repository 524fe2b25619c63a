"""The `mtp-cli` group, and the one place library errors become one line and exit code 2."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, Optional

import click
from rich.logging import RichHandler

from gguf_tools.errors import GGUFToolError
from mtp_cli import __version__
from mtp_cli.cli.llama_flags import settle_refusals, with_llama_env
from mtp_cli.cli.render import err, one_line_error
from mtp_cli.errors import MtpError


class UserError(click.ClickException):
    """Bad input or a refused operation: one line, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        one_line_error(self.format_message())


class MtpCommand(click.Command):
    """A command whose library errors become one line naming this command's own flags, exit code 2;
    its options read llama.cpp's LLAMA_ARG_* variables, and it takes -v as the group does."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        settle_refusals(self)
        with_llama_env(self)
        self.params.append(
            click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_verbose, help=_VERBOSE_HELP)
        )

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (GGUFToolError, MtpError) as e:
            raise UserError(e.spelled(lambda name: self.flag_of(name, ctx))) from None
        except KeyboardInterrupt:
            interrupted()

    def flag_of(self, name: str, ctx: click.Context | None = None) -> str:
        """How this command spells the setting `name` (its option's first flag), else how another
        command of the group does, else the bare name."""
        root = ctx.find_root().command if ctx is not None else None
        others = list(root.commands.values()) if isinstance(root, click.Group) else []
        for cmd in (self, *others):
            for p in cmd.params:
                if p.name == name and isinstance(p, click.Option):
                    return p.opts[0]
        return name


_VERBOSE_HELP = "Log what the library does (also before the command)."


def set_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_time=False, show_path=False)],
        force=True,
    )
    for name in ("gguf_tools", "mtp_cli"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.NOTSET)


def _verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        set_logging(True)


def interrupted() -> None:
    """Ctrl-C: one line and exit code 130, wherever it lands."""
    err.print("interrupted")
    sys.exit(130)


class MtpGroup(click.Group):
    """The group; Ctrl-C while parsing, in the group's own callback or in click's own lines around
    them (entering and closing the context) is one line and 130 too (click's default is "Aborted!"
    and 1)."""

    command_class = MtpCommand

    def main(
        self,
        args: Optional[Sequence[str]] = None,
        prog_name: Optional[str] = None,
        complete_var: Optional[str] = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """click's main; standalone, what click would report is reported here, an interrupt as one
        line and 130. Not standalone, as click's, but a command's return value is not returned (None)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)  # (an Exit's code, or None)
        except click.Abort as e:
            if isinstance(e.__cause__, KeyboardInterrupt):
                interrupted()
            click.echo("Aborted!", err=True)  # (end of input at a prompt)
            sys.exit(1)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            interrupted()
        sys.exit(code if isinstance(code, int) else 0)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()
            raise

    def invoke(self, ctx: click.Context) -> None:
        try:
            super().invoke(ctx)  # (a command's return value is no exit code: main)
        except KeyboardInterrupt:
            interrupted()


def _version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit()


def version_text() -> str:
    """mtp-cli's version, llama-cpp-python's, and what llama.cpp can run on here (loads llama.cpp)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        bindings = version("llama-cpp-python")
    except PackageNotFoundError:
        bindings = "not installed"
    lines = [f"mtp-cli {__version__}", f"llama-cpp-python {bindings}"]
    if bindings != "not installed":
        from mtp_cli import llama_ext as lx

        lines.append(f"GPU offload: {'yes' if lx.supports_gpu_offload() else 'no (a CPU build)'}")
        lines.append(
            f"RPC backend: {'yes (--rpc HOST:PORT,...)' if lx.supports_rpc() else 'no (make setup builds one)'}"
        )
        found = [f"{d.name} ({d.description}, {d.memory_total / 2**30:.1f} GiB)" for d in lx.devices()]
        lines.append(f"devices: {', '.join(found) or 'none found'}")
        lines.append(f"llama.cpp system: {lx.system_info().strip()}")
        from mtp_cli.cpu_check import summary_lines

        lines.extend(summary_lines())
    return "\n".join(lines)


@click.group(cls=MtpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version", is_flag=True, expose_value=False, is_eager=True, callback=_version, help="Show the versions and exit."
)
@click.option("-v", "--verbose", is_flag=True, help=_VERBOSE_HELP)
def main(verbose: bool) -> None:
    """Multi-token prediction for local GGUF models."""
    set_logging(verbose)


__all__ = ["main", "UserError", "MtpCommand"]
