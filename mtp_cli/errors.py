"""Every error mtp_cli raises on bad input or a refused request: one line that names what is wrong
and what to change. Settings are named in backticks by their parameter names (`draft_n_max`);
the CLI spells them as its flags (gguf_tools.errors.spelled). No llama.cpp import here."""

from __future__ import annotations

from collections.abc import Callable

from gguf_tools.errors import spelled


class MtpError(Exception):
    """Base: a request the library refuses, with a one-line message."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)

    def spelled(self, spell: Callable[[str], str] = lambda name: name) -> str:
        return spelled(self.message, spell)

    def __str__(self) -> str:
        return self.spelled()


class ConfigError(MtpError, ValueError):
    """A setting out of range (draft N, n_ctx, sampling parameters, prompt, budget...)."""


class ModelFileError(MtpError):
    """A model file is missing, not a GGUF, malformed, of the wrong kind, or llama.cpp cannot load it."""


class NoMtpHeadError(MtpError):
    """Drafting with an MTP head from a model that has none (and no sidecar)."""


class VocabMismatchError(MtpError):
    """A draft model or MTP sidecar whose vocabulary differs from the target's."""


class LlamaError(MtpError, RuntimeError):
    """llama.cpp refused: a NULL model or context, a failed decode, a refused rollback."""


class ChatTemplateError(MtpError):
    """The model has no usable chat template."""


class ProfileError(MtpError):
    """The profile store cannot be read or written."""


class TuneError(ConfigError):
    """A tuning request that cannot run (budget too small, no prompts...)."""


class MeasureError(TuneError):
    """A measurement that found nothing to measure (prompts the model ends at once, no generation time)."""


class DemoError(MtpError):
    """The demo model cannot be built here (its source is not installed, or the cache is unusable)."""


class MissingExtraError(MtpError):
    """An optional extra a command needs is not installed (the message names the pip install)."""


class MissingTorchError(MissingExtraError):
    """torch is not installed (the `train` extra)."""


class TrainDataError(MtpError):
    """A training work folder or data store that cannot be used (corrupt, or another model's)."""


__all__ = [
    "MtpError",
    "ConfigError",
    "ModelFileError",
    "NoMtpHeadError",
    "VocabMismatchError",
    "LlamaError",
    "ChatTemplateError",
    "ProfileError",
    "TuneError",
    "MeasureError",
    "DemoError",
    "MissingExtraError",
    "MissingTorchError",
    "TrainDataError",
]
