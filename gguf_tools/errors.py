"""Typed errors. Each carries one line that names the file, key or value at fault."""

from __future__ import annotations

from pathlib import Path


class GGUFToolError(Exception):
    """Base for every error the library raises on bad input or a refused operation."""

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path is not None else message)


class BadFileError(GGUFToolError):
    """The file is missing, unreadable, not a GGUF, truncated or malformed."""


class MismatchError(GGUFToolError):
    """Two files that must agree (arch, dims, vocabulary) do not."""


class RefusedError(GGUFToolError):
    """The operation is well-formed but would be wrong or destructive without an override."""
