"""The entry point of `mtp-cli` and `python -m mtp_cli`: nothing is imported before the Ctrl-C guard,
so an interrupt during start-up imports is one line and exit code 130 too, never a traceback."""

from __future__ import annotations

import _thread
import sys


def _unraisable(u: sys.UnraisableHookArgs) -> None:
    """A Ctrl-C that landed in a callback Python cannot raise from (a weakref's, a __del__, as in
    importlib's module locks) is delivered again, to the main flow, instead of printed as an ignored
    exception with its traceback."""
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
        try:  # from another thread: in this one the handler would run at once, inside this hook
            _thread.start_new_thread(_thread.interrupt_main, ())
        except RuntimeError:  # (the interpreter is shutting down: so is the command)
            pass
        return
    sys.__unraisablehook__(u)


def main() -> None:
    sys.unraisablehook = _unraisable
    try:
        from mtp_cli.cli import main as cli

        cli()
    except KeyboardInterrupt:
        try:
            sys.stderr.write("interrupted\n")
        finally:
            sys.exit(130)


if __name__ == "__main__":
    main()
