"""The entry point of `mtp-cli` and `python -m mtp_cli`: nothing is imported before the Ctrl-C guard,
so an interrupt during start-up imports is one line and exit code 130 too, never a traceback."""

from __future__ import annotations

import _thread  # (both already loaded by the interpreter itself)
import sys

_interrupted: list[bool] = []  # a Ctrl-C Python could not raise where it landed (see _unraisable)
_main_thread: list[int] = []


def _deliver() -> None:
    import signal

    signal.pthread_kill(_main_thread[0], signal.SIGINT)  # (a real signal: it also ends a blocked read)


def _unraisable(u: sys.UnraisableHookArgs) -> None:
    """A Ctrl-C that landed in a callback Python cannot raise from (a weakref's, a __del__, as in
    importlib's module locks) is delivered again to the main flow, instead of printed as an ignored
    exception with its traceback; if the command ends first, it still exits as interrupted."""
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
        _interrupted.append(True)
        try:  # from another thread: in this one the handler would run at once, inside this hook
            _thread.start_new_thread(_deliver, ())
        except RuntimeError:  # (the interpreter is shutting down)
            pass
        return
    sys.__unraisablehook__(u)


def main() -> None:
    _main_thread[:] = [_thread.get_ident()]
    sys.unraisablehook = _unraisable
    try:
        from mtp_cli.cli import main as cli

        cli()
    except KeyboardInterrupt:
        _interrupted.append(True)
    except SystemExit:
        if not _interrupted:
            raise
    if _interrupted:
        try:
            sys.stderr.write("interrupted\n")
        finally:
            sys.exit(130)


if __name__ == "__main__":
    main()
