"""The model files a runtime is given: opened once, bounds-checked, and refused by name where
llama.cpp would fail on them (a drafter given as the model, KV cache types a file cannot take)."""

from __future__ import annotations

import os
from typing import Optional

from gguf_tools.errors import BadFileError
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.loadable import require_loadable
from gguf_tools.loadable.kv_cache import kv_cache_problem
from gguf_tools.names import ASSISTANT_ARCHS
from mtp_cli.config import GenConfig
from mtp_cli.errors import ConfigError, ModelFileError


def open_model_file(path: str | os.PathLike[str], role: str) -> GGUFFile:
    """Bounds-checked header read, and the trunk's llama.cpp limits, before anything else looks at
    the file (load_model checks the head's too, when it loads one)."""
    try:
        gf = open_gguf(path)
        require_loadable(gf.scan, gf.path, mtp=False)
        return gf
    except BadFileError as e:
        raise ModelFileError(f"{role}: {e}") from None


def open_target_file(path: str | os.PathLike[str]) -> GGUFFile:
    """The model to generate with: not a drafter's file."""
    gf = open_model_file(path, "model")
    if gf.arch in ASSISTANT_ARCHS:
        raise ModelFileError(
            f"{gf.path.name} is a {gf.arch} drafter: give it as `draft_model` (with `spec_type` mtp) "
            "and its target as the model"
        )
    if gf.is_mtp_sidecar:
        raise ModelFileError(
            f"{gf.path.name} is an MTP-only sidecar: give it as `draft_model` and the trunk as the model"
        )
    return gf


def check_kv(cfg: GenConfig, *files: Optional[GGUFFile]) -> None:
    """Refuse, naming the setting, KV cache types llama.cpp would not create a context with for
    these files (the target's, and the draft file's when the drafter in use reads it)."""
    for gf in files:
        why = kv_cache_problem(gf.scan, cfg.cache_type_k, cfg.cache_type_v, cfg.flash_attn) if gf else None
        if gf and why:
            raise ConfigError(f"{gf.path.name}: {why}")


__all__ = ["open_model_file", "open_target_file", "check_kv"]
