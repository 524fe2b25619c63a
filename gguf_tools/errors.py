"""Typed errors. Each carries one line that names the file, key or value at fault.

A message names a setting the caller can change in backticks, by its parameter name (`overwrite`,
`replace`): str() shows the bare name; a front end shows its own spelling with `spelled` (the CLI:
--overwrite). Library messages never spell command-line flags.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

_OPTION = re.compile(r"`(\w+)`")


def spelled(message: str, spell: Callable[[str], str] = lambda name: name) -> str:
    """`message` with each `name` in backticks replaced by spell(name)."""
    return _OPTION.sub(lambda m: spell(m.group(1)), message)


class GGUFToolError(Exception):
    """Base for every error the library raises on bad input or a refused operation."""

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.message = message
        super().__init__(message)

    def spelled(self, spell: Callable[[str], str] = lambda name: name) -> str:
        text = spelled(self.message, spell)
        return f"{self.path}: {text}" if self.path is not None else text

    def __str__(self) -> str:
        return self.spelled()


class BadFileError(GGUFToolError):
    """The file is missing, unreadable, not a GGUF, truncated or malformed."""


class MismatchError(GGUFToolError):
    """Two files that must agree (arch, dims, vocabulary) do not."""


class RefusedError(GGUFToolError):
    """The operation is well-formed but would be wrong or destructive without an override."""


class WriteError(GGUFToolError):
    """An output could not be written (disk full, read-only, no permission, I/O error)."""
