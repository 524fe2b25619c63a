"""Atomic output: write to a temporary file beside the target, rename it into place when complete.

Every file the project writes (GGUFs, the profile store, checkpoints, indexes, prompt lists) goes
through `atomic_output`, so a crash, a full disk or Ctrl-C leaves the old file or none, never half
of one, and no temporary behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, durable: bool | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends normally it replaces `path`,
    otherwise it is removed. The new file gets the old one's permissions (else the umask's).
    `durable` (default: when `path` exists) fsyncs it first, so a crash cannot leave neither file."""
    out = Path(path)
    exists = out.exists()
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, out.stat().st_mode & 0o7777 if exists else 0o666 & ~umask())  # mkstemp makes it 0600
        yield tmp
        if durable if durable is not None else exists:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: str | os.PathLike[str], text: str, *, durable: bool | None = None) -> None:
    """`path` holds `text` (UTF-8), written atomically (`durable` as for atomic_output)."""
    with atomic_output(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")
