"""How exact is `adopt`? Teacher-forced agreement and perplexity of SmolLM2 adopted as glm4moe
against the original, beside the original's own noise (flash attention on against off).

    python benchmarks/adopt_bench.py [--text FILE] [--tokens 1024] [-t 2] [--json out.json]
    python benchmarks/adopt_bench.py --llama3     # a Llama-3.1-style source, adopted as step35

--llama3: the source is SmolLM2 with `rope_freqs.weight` holding llama 3 scaling factors (factor 8,
low/high frequency factors 1 and 4, an original context of 256 tokens, so they act over the text),
as llama.cpp's converter writes them for Llama 3.1/3.2; `adopt` then re-expresses it as step35.

The weights are the same bytes (llama's Q/K rows moved whole); what differs is the order in which
the attention sums over its dimensions, and on a quantized model (SmolLM2 is Q4_1) the activations
are re-quantized to Q8_1 before every matmul, so a last-bit difference can cross a rounding step.
The text (default: the project README, which no head here was trained on) is fed whole, and each
position's top-1 token and the next token's log-probability are compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def logits(model, toks: list[int], n_threads: int, flash: bool | None) -> np.ndarray:
    from mtp_cli import llama_ext as lx

    ctx = lx.create_context(
        model, n_ctx=len(toks) + 8, n_batch=len(toks), n_threads=n_threads, kv=lx.KvOptions(flash_attn=flash)
    )
    try:
        b = lx.Batch(len(toks))
        b.add_many(toks, 0)
        b.logits[: len(toks)] = 1  # every row
        lx.decode(ctx, b)
        return lx.logits_rows(ctx, len(toks), lx.n_vocab(model)).copy()
    finally:
        ctx.close()


def perplexity(lg: np.ndarray, toks: list[int]) -> float:
    z = lg[:-1] - lg[:-1].max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(toks) - 1), toks[1:]].mean()))


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    top1 = a.argmax(1) == b.argmax(1)
    srt = np.sort(a, 1)
    gap = srt[:, -1] - srt[:, -2]
    return {
        "top1_agreement": float(top1.mean()),
        "max_abs_logit_diff": float(np.abs(a - b).max()),
        "disagreement_gaps_max": float(gap[~top1].max()) if (~top1).any() else 0.0,
    }


def llama3_source(src: Path, folder: Path) -> Path:
    """SmolLM2 with llama 3 rope factors (computed as llama.cpp's converter does)."""
    from gguf_tools.gguf_file import open_gguf
    from tests.factory import llama3_factors
    from tests.hostile import edited

    gf = open_gguf(src)
    d = int(gf.arch_get("embedding_length")) // int(gf.arch_get("attention.head_count"))
    factors = llama3_factors(d, float(gf.arch_get("rope.freq_base", 10000.0)), 8.0, 1.0, 4.0, 256)
    return edited(src, folder / "llama3.gguf", add=(("rope_freqs.weight", factors),))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", type=Path, default=ROOT / "README.md")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--llama3", action="store_true", help="add llama 3 rope factors to the source first")
    args = ap.parse_args()
    from gguf_tools import ops
    from mtp_cli import llama_ext as lx
    from mtp_cli.demo import source_model

    lx.quiet_logs()
    src = source_model()
    with tempfile.TemporaryDirectory() as d:
        if args.llama3:
            src = llama3_source(src, Path(d))
        adopted_path = Path(d) / "adopted.gguf"
        ops.adopt(src, adopted_path)
        orig, adopted = lx.load_model(src), lx.load_model(adopted_path)
        toks = lx.tokenize(orig, args.text.read_text(encoding="utf-8"))[: args.tokens]
        runs = {
            "original, flash attention on": logits(orig, toks, args.threads, True),
            "original, flash attention off": logits(orig, toks, args.threads, False),
            "adopted, flash attention on": logits(adopted, toks, args.threads, True),
            "adopted, flash attention off": logits(adopted, toks, args.threads, False),
        }
        orig.close()
        adopted.close()
    names = list(runs)
    res = {"text": str(args.text), "tokens": len(toks), "perplexity": {k: perplexity(v, toks) for k, v in runs.items()}}
    res["original fa on vs off"] = compare(runs[names[0]], runs[names[1]])
    res["adopted vs original, fa on"] = compare(runs[names[0]], runs[names[2]])
    res["adopted vs original, fa off"] = compare(runs[names[1]], runs[names[3]])
    what = "with llama 3 rope factors, adopted as step35" if args.llama3 else "adopted as glm4moe"
    print(f"SmolLM2-135M-Instruct Q4_1 {what}, {len(toks)} tokens of {args.text.name}, teacher-forced")
    for k, v in res["perplexity"].items():
        print(f"  perplexity, {k}: {v:.3f}")
    for k in ("original fa on vs off", "adopted vs original, fa on", "adopted vs original, fa off"):
        v = res[k]
        print(
            f"  {k}: top-1 agreement {v['top1_agreement']:.2%}, max |logit diff| {v['max_abs_logit_diff']:.3f}, "
            f"largest top-2 gap where top-1 differs {v['disagreement_gaps_max']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
