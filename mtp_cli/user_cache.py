"""The user cache folder: the demo model, tuned profiles, the CPU self-check's verdicts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$MTP_CLI_CACHE, else $XDG_CACHE_HOME/mtp-cli, else ~/.cache/mtp-cli."""
    if os.environ.get("MTP_CLI_CACHE"):
        return Path(os.environ["MTP_CLI_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtp-cli"


__all__ = ["cache_dir"]
