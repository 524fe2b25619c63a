"""The command line: parse, call the library, render. The only place errors become exit codes.

    app.py        the group, and the one place library errors become one line and exit code 2
    options.py    the options several commands share, defined once
    render.py     tables, summaries and progress (rich)
    generate.py   generate
    files.py      inspect, pack, strip, extract, adopt
    speed.py      tune, bench
    serve.py      serve (the OpenAI-compatible server)
    train.py      train
    doctor.py     doctor (the build, the CPU self-check)

Command modules import the library's llama.cpp-bound parts inside the commands, so `mtp-cli
--help` and the GGUF commands never load llama.cpp.
"""

from mtp_cli.cli import doctor, files, generate, serve, speed, train  # noqa: F401  (each registers its commands)
from mtp_cli.cli.app import main

__all__ = ["main"]
