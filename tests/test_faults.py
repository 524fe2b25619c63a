"""Write faults end to end: a full disk and a read-only folder (a small tmpfs where the tests run as
root; gguf_tools.atomic's own tests patch the os calls instead), a writer killed at random points,
and two packs racing to one output."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from mtp_cli.cli import main
from tests.bigfile import make_pack_inputs

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def small_fs(size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted for the test (root only; skipped elsewhere)."""
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="mtp-fs-"))
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    ).returncode:
        where.rmdir()
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        with contextlib.suppress(OSError):
            where.rmdir()


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _pack(g: dict[str, Path], out: Path, *extra: str):
    return CliRunner().invoke(main, ["pack", str(g["trunk"]), "--heads", str(g["sidecar"]), "-o", str(out), *extra])


def test_a_full_disk_is_one_line_and_the_old_output_survives(tiny_models):
    g = tiny_models("glm4moe")
    with small_fs("64k") as fs:
        old = fs / "out.gguf"
        old.write_bytes(b"the user's old file")
        r = _pack(g, old, "--overwrite")
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
        assert f"{old}: cannot write: No space left on device" in lines[0]
        assert old.read_bytes() == b"the user's old file" and [p.name for p in fs.iterdir()] == ["out.gguf"]


def test_a_read_only_folder_is_one_line(tiny_models):
    g = tiny_models("glm4moe")
    with small_fs("1m") as fs:
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        r = _pack(g, fs / "out.gguf")
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
        assert f"{fs}: cannot write into this folder" in lines[0] and list(fs.iterdir()) == []


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> dict[str, Path]:
    """A loadable trunk and sidecar of about 130 MB each: a pack takes long enough to be killed midway."""
    folder = tmp_path_factory.mktemp("big")
    trunk, sidecar = make_pack_inputs(folder, 0.13, n_vocab=2000)
    return {"trunk": trunk, "sidecar": sidecar}


def _pack_cmd(big: dict[str, Path], out: Path) -> list[str]:
    return [sys.executable, "-m", "mtp_cli", "pack", str(big["trunk"]), "--heads", str(big["sidecar"]), "-o", str(out)]


@pytest.mark.slow
def test_a_pack_killed_at_random_points_leaves_nothing(big, tmp_path):
    before = {k: _digest(p) for k, p in big.items()}
    rng = random.Random(0)
    out = tmp_path / "out.gguf"
    for _ in range(5):
        p = subprocess.Popen(_pack_cmd(big, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        time.sleep(rng.uniform(0.2, 1.2))
        p.send_signal(signal.SIGKILL)
        p.wait()
        left = list(tmp_path.iterdir())
        assert left in ([], [out]), left  # nothing, or (killed after publishing) the whole output
        if left:
            assert subprocess.run([sys.executable, "-m", "mtp_cli", "inspect", str(out)], cwd=ROOT).returncode == 0
            out.unlink()
    assert {k: _digest(p) for k, p in big.items()} == before


@pytest.mark.slow
def test_of_two_packs_racing_to_one_output_exactly_one_wins(big, tmp_path):
    out = tmp_path / "out.gguf"
    procs = [
        subprocess.Popen(_pack_cmd(big, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(2)
    ]
    results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    loser = next(err for rc, err in results if rc == 2)
    assert "output exists" in loser and "Traceback" not in loser
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]
    assert subprocess.run([sys.executable, "-m", "mtp_cli", "inspect", str(out)], cwd=ROOT).returncode == 0
