"""Would llama.cpp load this file, and run it without crashing? The header checked against every
limit in gguf_tools.limits, before llama.cpp (or gguf's reader) ever sees the file.

`problems(scan)` lists what breaks a rule; `require_loadable` raises the first as one line naming
the key, its value and the limit. Each check module registers its checks with `header.check`.
"""

from __future__ import annotations

from pathlib import Path

from gguf_tools.errors import BadFileError
from gguf_tools.loadable import hparams, keys, tensors, vocab  # noqa: F401  (each registers its checks)
from gguf_tools.loadable.header import CHECKS, Header, Problem
from gguf_tools.prescan import Prescan

_ORDER = ("keys", "hparams", "vocab", "tensors")  # the container and key types first, as llama.cpp reads them


def problems(scan: Prescan, *, mtp: bool | None = None) -> list[Problem]:
    """Every rule the header breaks. `mtp`: also the rules of an MTP context (default: when the
    file has head blocks)."""
    h = Header(scan)
    use_mtp = h.n_nextn > 0 if mtp is None else mtp
    out: list[Problem] = []
    for fn in sorted(CHECKS, key=lambda f: _ORDER.index(f.__module__.rsplit(".", 1)[-1])):
        for p in fn(h):
            if (not p.rule.mtp or use_mtp) and p.rule.applies(h.arch):
                out.append(p)
    return out


def require_loadable(scan: Prescan, path: Path, *, mtp: bool | None = None) -> None:
    """Raise BadFileError (one line: the key, its value, the limit, what llama.cpp would do) if
    the header breaks any rule."""
    found = problems(scan, mtp=mtp)
    if found:
        raise BadFileError(found[0].line(), path)


__all__ = ["problems", "require_loadable", "Problem"]
