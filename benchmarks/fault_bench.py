"""Faults while packing a head into a GB-sized trunk: kills at random points, a full disk, a read-only
folder, two packs racing to one output. Counts what each leaves behind.

    python benchmarks/fault_bench.py [--gb 1.1] [--kills 20] [--races 5] [--dir /tmp] [--json out.json]

Kills: each pack is SIGKILLed at a random point of a full pack's run time; then the folder is
searched for stray files (anything but the inputs and a complete output) and partial outputs (an
output that does not prescan or has the wrong size). Done twice: as mtp-cli writes (an unnamed
O_TMPFILE temporary) and with named temporaries forced (the fallback for filesystems without
O_TMPFILE), where the next write to the folder must remove what the killed one left. The full disk
and read-only folder are small tmpfs mounts (root only; reported as skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_NAMED = "from gguf_tools import atomic; atomic._tmpfile_works = lambda folder, dev: False; "
_ENTRY = "import sys; sys.argv[0] = 'mtp-cli'; from mtp_cli.__main__ import main; main()"


def pack_cmd(trunk: Path, sidecar: Path, out: Path, named: bool = False) -> list[str]:
    code = (_NAMED if named else "") + _ENTRY
    return [sys.executable, "-c", code, "pack", str(trunk), "--heads", str(sidecar), "-o", str(out)]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)


def complete(out: Path, size: int) -> bool:
    """A finished output: the right size, and its header prescans."""
    if not out.exists() or out.stat().st_size != size:
        return False
    return run([sys.executable, "-m", "mtp_cli", "inspect", str(out)]).returncode == 0


def kills(inputs: set[Path], trunk: Path, sidecar: Path, folder: Path, n: int, named: bool, t_full: float, size: int):
    """(stray files, partial outputs, outputs completed before the kill, temporaries the kills left
    that the next write removed) over n kills."""
    rng, out = random.Random(1 if named else 0), folder / "out.gguf"
    stray = partial = finished = swept = 0
    for _ in range(n):
        out.unlink(missing_ok=True)
        p = subprocess.Popen(pack_cmd(trunk, sidecar, out, named), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.95) * t_full)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if out.exists():
            done = complete(out, size)
            finished, partial = finished + done, partial + (not done)
        if named:  # the fallback's promise: the next write to the folder removes what the kill left
            swept += len([x for x in folder.iterdir() if x not in inputs and x != out])
            r = run(pack_cmd(trunk, sidecar, folder / "next.gguf", named))
            assert r.returncode == 0, r.stderr
            (folder / "next.gguf").unlink()
        stray += len([x for x in folder.iterdir() if x not in inputs and x != out])
    out.unlink(missing_ok=True)
    return stray, partial, finished, swept


def one_line_exit_2(r: subprocess.CompletedProcess) -> bool:
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    return r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr


def on_tmpfs(size: str, read_only: bool, trunk: Path, sidecar: Path) -> dict:
    if os.geteuid() != 0:
        return {"skipped": "needs root to mount a tmpfs"}
    where = Path(tempfile.mkdtemp(prefix="fault_bench."))
    if run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]).returncode:
        where.rmdir()
        return {"skipped": "cannot mount a tmpfs"}
    try:
        if read_only:
            run(["mount", "-o", "remount,ro", str(where)])
        r = run(pack_cmd(trunk, sidecar, where / "out.gguf"))
        return {
            "exit": r.returncode,
            "one_line_exit_2": one_line_exit_2(r),
            "line": (r.stdout + r.stderr).strip().splitlines()[-1:],
            "left": len(list(where.iterdir())),
        }
    finally:
        run(["umount", "-l", str(where)])
        where.rmdir()


def races(trunk: Path, sidecar: Path, folder: Path, n: int) -> dict:
    """n trials of two packs started together to one new output."""
    out, exactly_one, raced = folder / "race.gguf", 0, 0
    for _ in range(n):
        out.unlink(missing_ok=True)
        procs = [
            subprocess.Popen(pack_cmd(trunk, sidecar, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        res = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
        exactly_one += sorted(rc for rc, _ in res) == [0, 2]
        raced += any("meanwhile" in err for _, err in res)  # both were writing: the publish decided
    out.unlink(missing_ok=True)
    return {"trials": n, "exactly_one_succeeded": exactly_one, "decided_at_publish": raced}


def report(res: dict) -> None:
    gb_in, gb_out = res["trunk_bytes"] / 1e9, res["out_bytes"] / 1e9
    print(f"pack of a {gb_in:.2f} GB trunk ({gb_out:.2f} GB out): {res['pack_s']:.1f} s")
    for k, label in (("kills", "O_TMPFILE"), ("kills_named", "named temporaries")):
        v = res[k]
        print(
            f"{v['n']} SIGKILLs ({label}): {v['stray']} stray files, {v['partial']} partial outputs, "
            f"{v['finished']} finished before the kill"
            + (f"; {v['swept']} temporaries left, removed by the next write" if k == "kills_named" else "")
        )
    for k in ("full_disk", "read_only"):
        v = res[k]
        print(
            f"{k}: "
            + (
                v["skipped"]
                if "skipped" in v
                else f"exit {v['exit']}, one line: {v['one_line_exit_2']}, "
                f"files left: {v['left']}; {v['line'][0] if v['line'] else ''}"
            )
        )
    v = res["race"]
    print(
        f"2 concurrent packs to one output, {v['trials']} trials: exactly one succeeded in "
        f"{v['exactly_one_succeeded']} ({v['decided_at_publish']} decided at the publish)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.1)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--races", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.bigfile import make_pack_inputs

    folder = Path(tempfile.mkdtemp(prefix="fault_bench.", dir=args.dir))
    try:
        trunk, sidecar = make_pack_inputs(folder, args.gb)
        inputs = {trunk, sidecar}
        for _ in range(2):  # the second run is timed: the kills land within a warm run's span
            (folder / "full.gguf").unlink(missing_ok=True)
            t0 = time.perf_counter()
            r = run(pack_cmd(trunk, sidecar, folder / "full.gguf"))
            t_full = time.perf_counter() - t0
            assert r.returncode == 0, r.stderr
        size = (folder / "full.gguf").stat().st_size
        (folder / "full.gguf").unlink()
        res: dict = {"trunk_bytes": trunk.stat().st_size, "out_bytes": size, "pack_s": t_full}
        for named in (False, True):
            s, p, f, w = kills(inputs, trunk, sidecar, folder, args.kills, named, t_full, size)
            res["kills_named" if named else "kills"] = {
                "n": args.kills,
                "stray": s,
                "partial": p,
                "finished": f,
                "swept": w,
            }
        res["full_disk"] = on_tmpfs("64m", False, trunk, sidecar)
        res["read_only"] = on_tmpfs("1m", True, trunk, sidecar)
        res["race"] = races(trunk, sidecar, folder, args.races)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
