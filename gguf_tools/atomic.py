"""Atomic output: write a file completely out of sight, then publish it under its name in one step.

Every file the project writes (GGUFs, the profile store, checkpoints, indexes, prompt lists) goes
through `atomic_output`, so a crash, a full disk, a kill or Ctrl-C leaves the old file or none,
never half of one:
- The data goes to an unnamed file (O_TMPFILE) in the output's folder where the filesystem has
  them: a killed writer leaves nothing, the kernel frees it. Elsewhere it goes to a named
  temporary `.NAME.PID-XXXX.mtp-tmp` held under an exclusive flock; a later write to the same
  folder removes those whose writer is gone, and logs that it did.
- Publishing without `overwrite` is link() (or renameat2 RENAME_NOREPLACE): if another writer got
  there first, this one gets "output exists" instead of replacing the other's result.
- Every OSError while writing (ENOSPC, EDQUOT, EROFS, EACCES, EIO) becomes one WriteError naming
  the output and the reason; nothing is left behind and the old output is untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from gguf_tools.errors import RefusedError, WriteError

try:
    import fcntl
except ImportError:  # Windows: no flock, no stale sweep
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

TMP_SUFFIX = ".mtp-tmp"
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_RENAME_NOREPLACE = 1
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.ENOENT}
_RACED = "output exists: another writer created it meanwhile (`overwrite` replaces it)"
_tmpfile_ok: dict[int, bool] = {}  # st_dev -> can an O_TMPFILE be linked into place there


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


_LIBC = _libc() if os.name == "posix" else None


def _link_fd(fd: int, dest: Path) -> None:
    """Give the unnamed file `fd` the name `dest`; FileExistsError if `dest` exists."""
    fn = getattr(_LIBC, "linkat", None)
    if fn is not None and fn(fd, b"", _AT_FDCWD, os.fsencode(dest), _AT_EMPTY_PATH) == 0:
        return
    code = ctypes.get_errno() if fn is not None else errno.ENOSYS
    if code == errno.EEXIST:
        raise FileExistsError(code, os.strerror(code), str(dest))
    os.link(f"/proc/self/fd/{fd}", dest)  # the unprivileged way, where /proc allows it


def _rename_noreplace(src: Path, dest: Path) -> None:
    """Rename without replacing; FileExistsError if `dest` exists."""
    try:
        os.link(src, dest)
    except OSError as e:
        if e.errno not in _NO_LINK:
            raise
        fn = getattr(_LIBC, "renameat2", None)
        if fn is None or fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dest), _RENAME_NOREPLACE) != 0:
            code = ctypes.get_errno() if fn is not None else errno.ENOSYS
            if code == errno.EEXIST:
                raise FileExistsError(code, os.strerror(code), str(dest)) from None
            if dest.exists():  # neither link nor renameat2 here: the best a plain rename can do
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest)) from None
            os.rename(src, dest)
        return
    os.unlink(src)


def _tmpfile_works(folder: Path, dev: int) -> bool:
    """Whether an O_TMPFILE in `folder` can later be linked into place (probed once per filesystem)."""
    if dev not in _tmpfile_ok:
        ok = False
        with contextlib.suppress(OSError, AttributeError):
            fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600)
            probe = folder / f".probe.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}"
            try:
                _link_fd(fd, probe)
                os.unlink(probe)
                ok = True
            finally:
                os.close(fd)
        _tmpfile_ok[dev] = ok
    return _tmpfile_ok[dev]


def _lock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _writer_alive(name: str) -> bool:
    pid = name.rsplit(".", 2)[-2].split("-")[0] if name.count(".") >= 2 else ""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, someone else's
    return True


def sweep_stale(folder: Path) -> list[Path]:
    """Remove the named temporaries in `folder` whose writer is gone (no flock held, its pid not
    running); the paths removed."""
    removed: list[Path] = []
    if fcntl is None:
        return removed
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(".") and entry.name.endswith(TMP_SUFFIX) and entry.is_file(follow_symlinks=False):
                if not _writer_alive(entry.name) and _remove_if_unlocked(Path(entry.path)):
                    removed.append(Path(entry.path))
    for p in removed:
        log.warning("removed %s, left behind by a writer that was killed", p)
    return removed


def _remove_if_unlocked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)  # unlinked while locked: no writer can be using it
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _temp_name(out: Path) -> Path:
    return out.parent / f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}"


class _Temp:
    """The file being written: unnamed (`fd` only) or named (`name`, flocked through `fd`)."""

    def __init__(self, out: Path, mode: int):
        folder = out.parent
        self.name: Path | None = None
        if _tmpfile_works(folder, os.stat(folder).st_dev):
            self.fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
        else:
            self.name = _temp_name(out)
            self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            _lock(self.fd)  # held until closed: no sweep removes a name this file gets
            if hasattr(os, "fchmod"):
                os.fchmod(self.fd, mode)
            else:
                os.chmod(self.path, mode)
        except BaseException:
            self.discard()
            raise

    @property
    def path(self) -> Path:
        return self.name if self.name is not None else Path(f"/proc/self/fd/{self.fd}")

    def publish(self, out: Path, overwrite: bool, durable: bool) -> None:
        if durable:
            os.fsync(self.fd)
        if self.name is None:
            if not overwrite:
                _link_fd(self.fd, out)
                return
            self.name = _temp_name(out)
            _link_fd(self.fd, self.name)  # a name for os.replace, for a moment
        if overwrite:
            os.replace(self.name, out)
        else:
            _rename_noreplace(self.name, out)
        self.name = None

    def discard(self) -> None:
        if self.name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.name)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _mode_for(out: Path) -> int:
    try:
        return out.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~umask()


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str], *, overwrite: bool = True, durable: bool | None = None
) -> Iterator[Path]:
    """Yield a path to write `path`'s new contents to; when the block ends normally it is published
    as `path`, otherwise it vanishes. The new file gets the old one's permissions (else the
    umask's). `durable` (default: when `path` exists) fsyncs it first, so a crash cannot leave
    neither file. Without `overwrite`, an existing `path` (even one that appeared meanwhile) is
    refused. Raises WriteError naming `path` on any OSError of the write."""
    out = Path(path)
    exists = out.exists()
    if exists and not overwrite:
        raise RefusedError("output exists (`overwrite` replaces it)", out)
    sweep_stale(out.parent)
    try:
        tmp = _Temp(out, _mode_for(out))
    except OSError as e:
        raise WriteError(f"cannot write into this folder: {e.strerror or e}", out.parent) from None
    try:
        yield tmp.path
        try:
            tmp.publish(out, overwrite, durable if durable is not None else exists)
        except FileExistsError:
            raise RefusedError(_RACED, out) from None
    except OSError as e:
        raise WriteError(f"cannot write: {e.strerror or e}", out) from None
    finally:
        tmp.discard()


def write_text(path: str | os.PathLike[str], text: str, *, durable: bool | None = None) -> None:
    """`path` holds `text` (UTF-8), written atomically (`durable` as for atomic_output)."""
    with atomic_output(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")
