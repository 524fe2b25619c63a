"""Llama 3.x adopted as step35 (gguf_tools.adopt_step35) on a tiny file, where the kernels add almost no
noise: how close the adopted logits are to llama.cpp's own for the source.

    python benchmarks/step35_probe.py [--tokens 1100] [--dtype f32|q8_0] [-t 2]

A tiny llama file (tests/factory.py, `llama3_rope_orig=64`: llama 3 rope factors from a short
original context, so they act) and its adoption are decoded by llama.cpp over the same tokens
(teacher forced); prints the largest logit difference, the top-1 agreement and the perplexities,
beside the source's own flash attention on/off difference, and a control: the adopted file with its
rope factors dropped (they must matter). `adopt_bench.py --llama3` is the same on SmolLM2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adopt_bench import compare, logits, perplexity  # noqa: E402

from gguf_tools import ops  # noqa: E402
from mtp_cli import llama_ext as lx  # noqa: E402
from tests.factory import TinySpec, write_tiny_model  # noqa: E402
from tests.hostile import edited  # noqa: E402


def llama_source(folder: Path, dtype: str) -> Path:
    spec = TinySpec(arch="llama", kind="trunk", dtype=dtype, n_trunk_layers=3, trunk_mix=1.0, llama3_rope_orig=64)  # type: ignore[arg-type]
    return write_tiny_model(folder / "llama3.gguf", spec)


def teacher_forced(path: Path, toks: list[int], threads: int, flash: bool) -> np.ndarray:
    with lx.load_model(path) as m:
        return logits(m, toks, threads, flash)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1100)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    lx.quiet_logs()
    with tempfile.TemporaryDirectory() as tmp:
        src = llama_source(Path(tmp), args.dtype)
        dst = Path(tmp) / "step35.gguf"
        ops.adopt(src, dst)
        no_factors = edited(dst, Path(tmp) / "no-factors.gguf", drop=("rope_freqs.weight",))
        toks = [1] + np.random.default_rng(0).integers(3, 259, args.tokens - 1).tolist()
        ref, ref_fa = (teacher_forced(src, toks, args.threads, fa) for fa in (False, True))
        got, plain = (teacher_forced(f, toks, args.threads, False) for f in (dst, no_factors))
    for what, other in (("adopted", got), ("llama FA on", ref_fa), ("control, no rope factors", plain)):
        c = compare(ref, other)
        print(f"{what} vs llama: max |logit diff| {c['max_abs_logit_diff']:.3g}, top-1 {c['top1_agreement']:.4f}")
    print(f"perplexity: llama {perplexity(ref, toks):.4f}, adopted {perplexity(got, toks):.4f} ({len(toks)} tokens)")


if __name__ == "__main__":
    main()
