"""GGUF surgery for MTP heads, on top of the `gguf` package. No llama.cpp import here."""

from gguf_tools.errors import GGUFToolError, BadFileError, MismatchError, RefusedError

__all__ = ["GGUFToolError", "BadFileError", "MismatchError", "RefusedError"]
