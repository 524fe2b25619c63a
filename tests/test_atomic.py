"""gguf_tools.atomic: the one temp-then-replace write every output goes through."""

from __future__ import annotations

import os
import stat

import pytest

from gguf_tools.atomic import atomic_output, umask, write_text


def test_replaces_on_success_and_keeps_the_old_mode(tmp_path):
    p = tmp_path / "f.txt"
    write_text(p, "one")
    assert p.read_text() == "one" and stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask()
    os.chmod(p, 0o640)
    write_text(p, "two")
    assert p.read_text() == "two" and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]  # no temporary left


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("precious")
    with pytest.raises(RuntimeError):
        with atomic_output(p) as tmp:
            tmp.write_text("half")
            assert tmp.parent == p.parent and tmp.name.startswith(".f.txt.") and tmp.name.endswith(".tmp")
            raise RuntimeError("disk full")
    assert p.read_text() == "precious" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C too
        with atomic_output(tmp_path / "new.txt") as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]
