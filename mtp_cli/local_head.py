"""A model's own MTP head as a sidecar of its own, so it can be placed apart from the trunk (-ngld):
the trunk on a GPU or other machines (--rpc), the head on this one, as llama.cpp does with
`-md SIDECAR -ngld 0`. Extracted once per file into the user cache (`mtp-cli extract`'s sidecar)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from gguf_tools import ops
from gguf_tools.gguf_file import GGUFFile
from mtp_cli.user_cache import cache_dir

log = logging.getLogger(__name__)


def head_sidecar(gf: GGUFFile) -> Path:
    """The sidecar of `gf`'s head (the file, its size and its modification time name it)."""
    st = gf.path.stat()
    key = hashlib.sha256(f"{gf.path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / "heads" / f"{gf.path.stem}-head-{key}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        log.info("extracting %s's MTP head to %s, to place it apart from the trunk", gf.path.name, out)
        ops.extract(gf.path, out)
    return out


__all__ = ["head_sidecar"]
