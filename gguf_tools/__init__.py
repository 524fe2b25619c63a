"""GGUF surgery for MTP heads, on top of the `gguf` package. No llama.cpp import here."""

from gguf_tools.errors import BadFileError, GGUFToolError, MismatchError, RefusedError, WriteError

__all__ = ["GGUFToolError", "BadFileError", "MismatchError", "RefusedError", "WriteError"]
