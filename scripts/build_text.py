"""Regenerate stdlib_docs.txt: English prose from CPython standard-library docstrings.

    python scripts/build_text.py > mtp_cli/train/prompts/stdlib_docs.txt

Source: the docstrings of the modules, classes and functions below, as shipped with CPython
(Python Software Foundation License 2.0; copyright the Python Software Foundation). Only
docstrings of at least 300 characters are kept, one per paragraph block, in a fixed order,
capped at about 150 kB. The exact text depends on the Python version that ran this script.
"""

from __future__ import annotations

import importlib
import inspect

MODULES = (
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fractions",
    "functools",
    "gzip",
    "hashlib",
    "heapq",
    "html",
    "http.client",
    "inspect",
    "io",
    "itertools",
    "json",
    "logging",
    "math",
    "mimetypes",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
    "zipfile",
    "zlib",
)
MIN_CHARS, MAX_TOTAL = 300, 150_000


def docs() -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        objs = [mod] + [getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_")]
        for obj in objs:
            d = (
                inspect.getdoc(obj)
                if (inspect.ismodule(obj) and obj is mod) or inspect.isclass(obj) or inspect.isfunction(obj)
                else None
            )
            if not d or len(d) < MIN_CHARS or d in seen:
                continue
            seen.add(d)
            out.append(d.strip())
    total, kept = 0, []
    for d in out:
        if total + len(d) > MAX_TOTAL:
            break
        kept.append(d)
        total += len(d)
    return kept


if __name__ == "__main__":
    print("\n\n\n".join(docs()))
