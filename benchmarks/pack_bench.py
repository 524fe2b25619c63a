"""Pack a head into a synthetic multi-GB trunk: time against `cp` of the same file, and peak RSS.

    python benchmarks/pack_bench.py --gb 1.5 --repeats 3 [--dir /tmp] [--json out.json]

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
N_VOCAB, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 151936, 2048, 8192, 16, 4, 128  # a Qwen-sized vocabulary


def _q8_bytes(ne0: int, ne1: int) -> int:
    return ne0 // 32 * 34 * ne1


def _llama_kvs(n_layer: int) -> list:
    """A llama header as convert_hf_to_gguf writes one, with a GPT-2 style vocabulary and merges."""
    from gguf import GGUFValueType as T

    from gguf_tools.gguf_write import KV

    a = "llama"
    tokens = [f"tok{i:06d}" + "x" * (i % 7) for i in range(N_VOCAB)]
    merges = [f"tok{i:06d} x{i % 97}" for i in range(N_VOCAB - 549)]
    return [
        KV("general.architecture", a, T.STRING),
        KV("general.name", "pack-bench", T.STRING),
        KV(f"{a}.block_count", n_layer, T.UINT32),
        KV(f"{a}.context_length", 32768, T.UINT32),
        KV(f"{a}.embedding_length", N_EMBD, T.UINT32),
        KV(f"{a}.feed_forward_length", N_FF, T.UINT32),
        KV(f"{a}.attention.head_count", N_HEAD, T.UINT32),
        KV(f"{a}.attention.head_count_kv", N_HEAD_KV, T.UINT32),
        KV(f"{a}.rope.freq_base", 1e6, T.FLOAT32),
        KV(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, T.FLOAT32),
        KV(f"{a}.rope.dimension_count", HEAD_DIM, T.UINT32),
        KV(f"{a}.vocab_size", N_VOCAB, T.UINT32),
        KV("tokenizer.ggml.model", "gpt2", T.STRING),
        KV("tokenizer.ggml.pre", "qwen2", T.STRING),
        KV("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        KV("tokenizer.ggml.token_type", [1] * N_VOCAB, T.ARRAY, T.INT32),
        KV("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING),
        KV("tokenizer.ggml.bos_token_id", 1, T.UINT32),
        KV("tokenizer.ggml.eos_token_id", 2, T.UINT32),
    ]


def make_files(folder: Path, gb: float) -> tuple[Path, Path]:
    """A llama model of about `gb` GB (random Q8_0 bytes from one blob), adopted with a head slot;
    then the trunk and the head as a sidecar, as a user who packs would have them."""
    # Heavy imports stay in the child that makes the files: each measured process is forked from a
    # small parent, since a forked child's peak RSS counts the parent's memory until exec.
    import numpy as np
    from gguf import GGMLQuantizationType

    from gguf_tools import ops
    from gguf_tools.gguf_write import ArrayTensor, FileTensor, WritePlan, write_gguf

    Q8, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
    qd, kvd = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    mats = {"attn_q": (N_EMBD, qd), "attn_k": (N_EMBD, kvd), "attn_v": (N_EMBD, kvd), "attn_output": (qd, N_EMBD)}
    mats |= {"ffn_gate": (N_EMBD, N_FF), "ffn_up": (N_EMBD, N_FF), "ffn_down": (N_FF, N_EMBD)}
    per_layer = sum(_q8_bytes(*s) for s in mats.values())
    emb_bytes = _q8_bytes(N_EMBD, N_VOCAB)
    n_layer = max(1, round((gb * 1e9 - emb_bytes) / per_layer))
    blob = folder / "blob.bin"
    rng = np.random.default_rng(0)
    with open(blob, "wb") as f:
        for _ in range(0, emb_bytes, 64 << 20):
            f.write(rng.integers(0, 256, size=min(64 << 20, emb_bytes - f.tell()), dtype=np.uint8).tobytes())
    ones = np.ones(N_EMBD, np.float32)
    tensors: list = [FileTensor("token_embd.weight", Q8, (N_EMBD, N_VOCAB), emb_bytes, blob, 0)]
    for i in range(n_layer):
        tensors += [ArrayTensor(f"blk.{i}.attn_norm.weight", F32, (N_EMBD,), ones)]
        tensors += [FileTensor(f"blk.{i}.{n}.weight", Q8, s, _q8_bytes(*s), blob, 0) for n, s in mats.items()]
        tensors += [ArrayTensor(f"blk.{i}.ffn_norm.weight", F32, (N_EMBD,), ones)]
    tensors.append(ArrayTensor("output_norm.weight", F32, (N_EMBD,), ones))
    src, full = folder / "llama.gguf", folder / "full.gguf"
    write_gguf(WritePlan("llama", 32, _llama_kvs(n_layer), tensors), src)
    blob.unlink()
    from gguf_tools.adopt import plan_adopt
    from gguf_tools.gguf_file import open_gguf

    ops.write_plan(plan_adopt(open_gguf(src), with_head_slot=True, head_type="q8_0"), full)  # a Q8_0 model's head
    src.unlink()
    trunk, sidecar = folder / "trunk.gguf", folder / "sidecar.gguf"
    ops.strip(full, trunk)
    ops.extract(full, sidecar)
    full.unlink()
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
        ]
        rows = {"cp": [], "pack": []}
        cmds = {"cp": ["cp", str(trunk), str(folder / "copy.gguf")], "pack": cli}
        for i in range(args.repeats):
            for name in ("cp", "pack") if i % 2 == 0 else ("pack", "cp"):  # alternate who goes first
                for out in ("copy.gguf", "packed.gguf"):
                    (folder / out).unlink(missing_ok=True)
                os.sync()  # each run starts with no dirty pages of the last one to write back
                rows[name].append(timed(cmds[name]))
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
