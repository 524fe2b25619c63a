"""Pack a head into a synthetic multi-GB trunk: time against `cp` of the same file, and peak RSS.

    python benchmarks/pack_bench.py --gb 1.5 --repeats 3 [--dir /tmp] [--json out.json]

The trunk is a valid qwen35-shaped GGUF whose Q8_0 tensors hold random bytes (it is never loaded
by llama.cpp here: this measures the copy). Each run is a fresh process so its peak RSS is its own.
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
ARCH = "qwen35"
N_EMBD, N_VOCAB, N_TRUNK = 4096, 32000, 8


def _kvs(n_blocks: int, n_heads: int) -> list:
    from gguf import GGUFValueType

    from gguf_tools.gguf_write import KV

    kvs = [
        KV("general.architecture", ARCH, GGUFValueType.STRING),
        KV(f"{ARCH}.block_count", n_blocks, GGUFValueType.UINT32),
        KV(f"{ARCH}.embedding_length", N_EMBD, GGUFValueType.UINT32),
        KV("tokenizer.ggml.tokens", [f"t{i}" for i in range(N_VOCAB)], GGUFValueType.ARRAY, GGUFValueType.STRING),
    ]
    if n_heads:
        kvs.insert(2, KV(f"{ARCH}.nextn_predict_layers", n_heads, GGUFValueType.UINT32))
    return kvs


def _q8_bytes(ne0: int, ne1: int) -> int:
    return ne0 // 32 * 34 * ne1


def make_files(folder: Path, gb: float) -> tuple[Path, Path]:
    """A trunk of about `gb` GB (random Q8_0 bytes from one blob, copied) and a matching sidecar."""
    # Heavy imports stay in the child that makes the files: each measured process is forked from a
    # small parent, since a forked child's peak RSS counts the parent's memory until exec.
    import numpy as np
    from gguf import GGMLQuantizationType

    from gguf_tools.gguf_write import ArrayTensor, FileTensor, WritePlan, write_gguf

    Q8, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
    blob = folder / "blob.bin"
    per_block = int(gb * 1e9 / N_TRUNK)
    ne1 = max(1, per_block // _q8_bytes(N_EMBD, 1))
    nbytes = _q8_bytes(N_EMBD, ne1)
    rng = np.random.default_rng(0)
    with open(blob, "wb") as f:
        for _ in range(0, nbytes, 64 << 20):
            f.write(rng.integers(0, 256, size=min(64 << 20, nbytes - f.tell()), dtype=np.uint8).tobytes())
    emb = ArrayTensor("token_embd.weight", F32, (N_EMBD, 8), np.zeros((8, N_EMBD), np.float32))
    tensors = [FileTensor(f"blk.{i}.ffn_up.weight", Q8, (N_EMBD, ne1), nbytes, blob, 0) for i in range(N_TRUNK)]
    trunk = folder / "trunk.gguf"
    write_gguf(WritePlan(ARCH, 32, _kvs(N_TRUNK, 0), [emb, *tensors]), trunk)
    head = [
        ArrayTensor(
            f"blk.{N_TRUNK}.nextn.eh_proj.weight",
            F32,
            (2 * N_EMBD, N_EMBD),
            rng.standard_normal((N_EMBD, 2 * N_EMBD), dtype=np.float32),
        ),
        ArrayTensor(f"blk.{N_TRUNK}.nextn.enorm.weight", F32, (N_EMBD,), np.ones(N_EMBD, np.float32)),
        ArrayTensor(f"blk.{N_TRUNK}.nextn.hnorm.weight", F32, (N_EMBD,), np.ones(N_EMBD, np.float32)),
    ]
    sidecar = folder / "sidecar.gguf"
    write_gguf(WritePlan(ARCH, 32, _kvs(N_TRUNK + 1, 1), [emb, *head]), sidecar)
    blob.unlink()
    return trunk, sidecar


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and the child's peak RSS in MB (RUSAGE_CHILDREN of a fresh wait)."""
    t0 = time.perf_counter()
    pid = subprocess.Popen(cmd).pid
    _, status, usage = os.wait4(pid, 0)
    dt = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return dt, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--make", type=Path, default=None, help=argparse.SUPPRESS)  # internal: the file-making child
    args = ap.parse_args()
    if args.make:
        sys.path.insert(0, str(ROOT))
        make_files(args.make, args.gb)
        return
    folder = Path(tempfile.mkdtemp(prefix="pack_bench.", dir=args.dir))
    try:
        subprocess.run([sys.executable, __file__, "--make", str(folder), "--gb", str(args.gb)], check=True)
        trunk, sidecar = folder / "trunk.gguf", folder / "sidecar.gguf"
        size = trunk.stat().st_size
        cli = [
            sys.executable,
            "-m",
            "mtp_cli",
            "pack",
            str(trunk),
            "--heads",
            str(sidecar),
            "-o",
            str(folder / "packed.gguf"),
            "--overwrite",
        ]
        rows = {"cp": [], "pack": []}
        for _ in range(args.repeats):
            rows["cp"].append(timed(["cp", str(trunk), str(folder / "copy.gguf")]))
            rows["pack"].append(timed(cli))
        base = timed([sys.executable, "-c", "import gguf_tools.ops, mtp_cli.cli"])
        res = {"trunk_bytes": size, "repeats": args.repeats, "python_import_rss_mb": base[1]}
        print(f"trunk: {size / 1e9:.2f} GB, repeats: {args.repeats}")
        print(f"{'':6}{'median s':>10}{'GB/s':>8}{'peak RSS MB':>13}")
        for name, r in rows.items():
            t = statistics.median(x[0] for x in r)
            rss = max(x[1] for x in r)
            res[name] = {"median_s": t, "gb_per_s": size / 1e9 / t, "peak_rss_mb": rss, "runs": r}
            print(f"{name:6}{t:10.2f}{size / 1e9 / t:8.2f}{rss:13.0f}")
        print(
            f"pack / cp time: {res['pack']['median_s'] / res['cp']['median_s']:.2f}x; "
            f"python + imports alone: {base[1]:.0f} MB RSS"
        )
        if args.json:
            args.json.write_text(json.dumps(res, indent=2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
