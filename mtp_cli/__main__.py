"""The entry point of `mtp-cli` and `python -m mtp_cli`: nothing is imported before the Ctrl-C guard,
so an interrupt during start-up imports is one line and exit code 130 too, never a traceback."""

import sys


def main() -> None:
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
