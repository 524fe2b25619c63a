"""Prompt files: one prompt per line; blank lines and lines starting with # are skipped."""

from __future__ import annotations

import os
from pathlib import Path

from mtp_cli.errors import ConfigError


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """The prompts in `path`; ConfigError (one line) when it cannot be read or holds none."""
    p = Path(path)
    try:
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read the prompts: {getattr(e, 'strerror', None) or e}") from None
    prompts = [ln for ln in lines if ln and not ln.startswith("#")]
    if not prompts:
        raise ConfigError(f"{p}: no prompts (one per line)")
    return prompts


__all__ = ["read_prompts"]
