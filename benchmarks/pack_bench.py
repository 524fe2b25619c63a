"""Pack a head into a synthetic multi-GB trunk: time against `cp` of the same file, and peak RSS.

    python benchmarks/pack_bench.py --gb 1.2 --repeats 3 [--dir /tmp] [--baseline SRC] [--json out.json]

The trunk is a llama model with a Qwen-sized vocabulary (152k tokens and merges) whose Q8_0 tensors
hold random bytes, adopted as glm4moe; the heads are its head slot as a sidecar (nothing is loaded
by llama.cpp here: this measures the write). Each run is a fresh process writing a new output (cp
writes a new file too), so its peak RSS is its own and neither pays for replacing a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], cwd: Path | None = None) -> tuple[float, float]:
    """Wall seconds and the child's peak RSS in MB (RUSAGE_CHILDREN of a fresh wait)."""
    t0 = time.perf_counter()
    pid = subprocess.Popen(cmd, cwd=cwd).pid
    _, status, usage = os.wait4(pid, 0)
    dt = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return dt, usage.ru_maxrss / 1024


def measure(
    folder: Path, repeats: int, baseline: Path | None, settle: float = 3.0
) -> dict[str, list[tuple[float, float]]]:
    """cp, pack (and pack from the `baseline` source tree), interleaved, each from a synced disk."""
    trunk, sidecar = folder / "trunk.gguf", folder / "sidecar.gguf"
    outs = {"cp": folder / "copy.gguf", "pack": folder / "packed.gguf", "baseline": folder / "packed-base.gguf"}
    cli = [sys.executable, "-m", "mtp_cli", "pack", str(trunk), "--heads", str(sidecar), "-o"]
    cmds = {"cp": ["cp", str(trunk), str(outs["cp"])], "pack": [*cli, str(outs["pack"])]}
    cwds: dict[str, Path | None] = {"cp": None, "pack": ROOT}
    if baseline is not None:  # `python -m` imports from its working folder first
        cmds["baseline"] = [*cli, str(outs["baseline"])]
        cwds["baseline"] = baseline
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    for i in range(repeats):
        order = list(cmds) if i % 2 == 0 else list(reversed(cmds))  # alternate who goes first
        for name in order:
            for out in outs.values():
                out.unlink(missing_ok=True)
            os.sync()  # each run starts with no dirty pages of the last one to write back
            time.sleep(settle)  # and the VM's disk done with them (a run right after another ran 2x slower)
            rows[name].append(timed(cmds[name], cwds[name]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp folder)")
    ap.add_argument("--baseline", type=Path, default=None, help="also pack with the mtp-cli source tree here")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--make", type=Path, default=None, help=argparse.SUPPRESS)  # internal: the file-making child
    args = ap.parse_args()
    if args.make:
        sys.path.insert(0, str(ROOT))
        from tests.bigfile import make_pack_inputs

        make_pack_inputs(args.make, args.gb)
        return
    folder = Path(tempfile.mkdtemp(prefix="pack_bench.", dir=args.dir))
    try:
        subprocess.run([sys.executable, __file__, "--make", str(folder), "--gb", str(args.gb)], check=True)
        size = (folder / "trunk.gguf").stat().st_size
        rows = measure(folder, args.repeats, args.baseline)
        base = timed([sys.executable, "-c", "import gguf_tools.ops, mtp_cli.cli"])
        res: dict = {"trunk_bytes": size, "repeats": args.repeats, "python_import_rss_mb": base[1]}
        print(f"trunk: {size / 1e9:.2f} GB, repeats: {args.repeats}")
        print(f"{'':9}{'median s':>10}{'GB/s':>8}{'peak RSS MB':>13}{'x cp':>7}")
        cp = statistics.median(x[0] for x in rows["cp"])
        for name, r in rows.items():
            t = statistics.median(x[0] for x in r)
            rss = max(x[1] for x in r)
            res[name] = {"median_s": t, "gb_per_s": size / 1e9 / t, "peak_rss_mb": rss, "x_cp": t / cp, "runs": r}
            print(f"{name:9}{t:10.2f}{size / 1e9 / t:8.2f}{rss:13.0f}{t / cp:7.2f}")
        print(f"pack - cp: {res['pack']['median_s'] - cp:.2f} s; python + imports alone: {base[1]:.0f} MB RSS")
        if args.json:
            args.json.write_text(json.dumps(res, indent=2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
