"""The `mtp-cli` group, and the one place library errors become one line and exit code 2."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
from rich.logging import RichHandler

from gguf_tools.errors import GGUFToolError
from mtp_cli import __version__
from mtp_cli.cli.render import err, one_line_error
from mtp_cli.errors import MtpError


class UserError(click.ClickException):
    """Bad input or a refused operation: one line, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        one_line_error(self.format_message())


class MtpCommand(click.Command):
    """A command whose library errors become one line naming this command's own flags, exit code 2."""

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


def interrupted() -> None:
    """Ctrl-C: one line and exit code 130, wherever it lands."""
    err.print("interrupted")
    sys.exit(130)


class MtpGroup(click.Group):
    """The group; Ctrl-C while parsing or in the group's own callback is one line and 130 too
    (click's default is "Aborted!" and 1)."""

    command_class = MtpCommand

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()


@click.group(cls=MtpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version")
@click.option("-v", "--verbose", is_flag=True, help="Log what the library does.")
def main(verbose: bool) -> None:
    """Multi-token prediction for local GGUF models."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_time=False, show_path=False)],
    )


__all__ = ["main", "UserError", "MtpCommand"]
