"""gguf_tools.atomic: the one write every output goes through, with an unnamed temporary where the
filesystem has O_TMPFILE and a named, flocked one elsewhere (both are tested)."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from gguf_tools import atomic
from gguf_tools.atomic import TMP_SUFFIX, atomic_output, sweep_stale, umask, write_text
from gguf_tools.errors import RefusedError, WriteError


@pytest.fixture(params=["tmpfile", "named"])
def mode(request, monkeypatch, tmp_path):
    if request.param == "named":
        monkeypatch.setattr(atomic, "_tmpfile_works", lambda folder, dev: False)
    elif not atomic._tmpfile_works(tmp_path, os.stat(tmp_path).st_dev):
        pytest.skip("no linkable O_TMPFILE on this filesystem")
    return request.param


def test_replaces_on_success_and_keeps_the_old_mode(tmp_path, mode):
    p = tmp_path / "f.txt"
    write_text(p, "one")
    assert p.read_text() == "one" and stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask()
    os.chmod(p, 0o640)
    write_text(p, "two")
    assert p.read_text() == "two" and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]  # no temporary left


def test_the_temporary_is_unnamed_or_named_beside_the_output(tmp_path, mode):
    with atomic_output(tmp_path / "f.txt") as tmp:
        tmp.write_text("x")
        names = [x.name for x in tmp_path.iterdir()]
        if mode == "tmpfile":
            assert names == [] and str(tmp).startswith("/proc/self/fd/")
        else:
            assert names == [tmp.name] and tmp.name.startswith(f".f.txt.{os.getpid()}-")
            assert tmp.name.endswith(TMP_SUFFIX)


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path, mode):
    p = tmp_path / "f.txt"
    p.write_text("precious")
    with pytest.raises(RuntimeError):
        with atomic_output(p) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert p.read_text() == "precious" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C too
        with atomic_output(tmp_path / "new.txt") as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO])
def test_an_os_error_while_writing_is_one_write_error_naming_the_output(tmp_path, mode, code):
    p = tmp_path / "f.txt"
    p.write_text("precious")
    with pytest.raises(WriteError) as ei:
        with atomic_output(p) as tmp:
            tmp.write_text("half")
            raise OSError(code, os.strerror(code))
    assert str(ei.value) == f"{p}: cannot write: {os.strerror(code)}"
    assert p.read_text() == "precious" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_a_folder_that_cannot_be_written_is_one_write_error(tmp_path, mode, monkeypatch):
    real_open = os.open

    def ro_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(atomic.os, "open", ro_open)
    with pytest.raises(WriteError, match="cannot write into this folder: Read-only file system"):
        write_text(tmp_path / "f.txt", "x")
    assert list(tmp_path.iterdir()) == []


def test_without_overwrite_an_output_that_appears_meanwhile_is_kept(tmp_path, mode):
    p = tmp_path / "f.txt"
    with pytest.raises(RefusedError, match="another writer created it meanwhile"):
        with atomic_output(p, overwrite=False) as tmp:
            tmp.write_text("mine")
            p.write_text("theirs")  # a concurrent writer publishes first
    assert p.read_text() == "theirs" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]
    with pytest.raises(RefusedError, match="output exists"):
        with atomic_output(p, overwrite=False):
            pass
    with atomic_output(tmp_path / "g.txt", overwrite=False) as tmp:
        tmp.write_text("new")
    assert (tmp_path / "g.txt").read_text() == "new"


def test_rename_noreplace_without_hard_links(tmp_path, monkeypatch):
    def no_link(*a, **k):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "link", no_link)
    src, dest = tmp_path / "a", tmp_path / "b"
    src.write_text("a")
    dest.write_text("b")
    with pytest.raises(FileExistsError):
        atomic._rename_noreplace(src, dest)
    assert dest.read_text() == "b"
    dest.unlink()
    atomic._rename_noreplace(src, dest)
    assert dest.read_text() == "a" and not src.exists()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_are_swept_and_reported(tmp_path, caplog):
    stale = tmp_path / f".out.gguf.{_dead_pid()}-abcd{TMP_SUFFIX}"
    stale.write_bytes(b"half")
    mine = tmp_path / f".out.gguf.{os.getpid()}-abcd{TMP_SUFFIX}"  # a live writer's (this process)
    mine.write_bytes(b"busy")
    other = tmp_path / ".someone-elses.tmp"  # not ours: never touched
    other.write_bytes(b"x")
    with caplog.at_level("WARNING", logger="gguf_tools"):
        write_text(tmp_path / "new.txt", "x")
    assert not stale.exists() and mine.exists() and other.exists()
    assert f"removed {stale}, left behind by a writer that was killed" in caplog.text


def test_a_locked_temporary_is_never_swept(tmp_path):
    import fcntl

    held = tmp_path / f".out.gguf.{_dead_pid()}-beef{TMP_SUFFIX}"  # pid gone, but someone holds the lock
    held.write_bytes(b"busy")
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert sweep_stale(tmp_path) == [] and held.exists()
    finally:
        os.close(fd)
    assert sweep_stale(tmp_path) == [held] and not held.exists()


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from gguf_tools import atomic
    if sys.argv[2] == "named":
        atomic._tmpfile_works = lambda folder, dev: False
    with atomic.atomic_output(sys.argv[1]) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"x" * 100000)
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("how", ["tmpfile", "named"])
def test_a_killed_writer_leaves_nothing_or_what_the_next_write_removes(tmp_path, how):
    if how == "tmpfile" and not atomic._tmpfile_works(tmp_path, os.stat(tmp_path).st_dev):
        pytest.skip("no linkable O_TMPFILE on this filesystem")
    out = tmp_path / "out.bin"
    r = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out), how], capture_output=True)
    assert r.returncode == -signal.SIGKILL
    left = list(tmp_path.iterdir())
    assert left == [] if how == "tmpfile" else len(left) == 1 and left[0].name.endswith(TMP_SUFFIX)
    write_text(tmp_path / "next.txt", "x")  # the next write to the folder sweeps it
    assert [x.name for x in tmp_path.iterdir()] == ["next.txt"]
