"""Decode-time acceptance of an MTP head: greedy decoding through the runtime, chat template applied.

    python benchmarks/accept_bench.py -m MODEL.gguf [-md SIDECAR] [--prompts FILE] [-N 3] [-n 128] [-t 2]

Default prompts: the held-out evaluation prompts (mtp_cli/train/prompts/eval_prompts.txt: written
apart from the training prompts, never trained on). Prints acceptance by draft position (P(the
first i drafts are all accepted)), mean accepted drafts and tokens per verify pass, and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.train.data import PROMPTS_DIR  # noqa: E402
from mtp_cli.train.pipeline import measure_acceptance  # noqa: E402

EVAL_PROMPTS = PROMPTS_DIR / "eval_prompts.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("-md", "--model-draft", type=Path, default=None, help="MTP sidecar")
    ap.add_argument("--prompts", type=Path, default=EVAL_PROMPTS)
    ap.add_argument("-N", "--draft-n-max", type=int, default=3)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=Path("accept_bench.json"))
    args = ap.parse_args()
    lx.quiet_logs()
    prompts = read_prompts(args.prompts)
    t0 = time.perf_counter()
    r = measure_acceptance(
        args.model,
        prompts,
        sidecar=str(args.model_draft) if args.model_draft else None,
        n_predict=args.n_predict,
        draft_n_max=args.draft_n_max,
        n_threads=args.threads,
    )
    out = {
        "model": str(args.model),
        "prompts_file": str(args.prompts),
        "prompts": len(prompts),
        "tokens": r.n_tokens,
        "verify_passes": r.n_verify,
        "drafted": r.n_drafted,
        "accepted": r.n_accepted,
        "draft_n_max": args.draft_n_max,
        "acceptance_by_pos": r.acceptance_by_pos,
        "mean_accepted_per_pass": r.mean_accepted_per_pass,
        "tokens_per_pass": r.n_tokens / r.n_verify if r.n_verify else 0.0,
        "seconds": time.perf_counter() - t0,
    }
    print(f"{len(prompts)} prompts, {r.n_tokens} tokens, {r.n_verify} verify passes at N={args.draft_n_max}")
    print("acceptance by draft position: " + "  ".join(f"{i + 1}: {a:.1%}" for i, a in enumerate(r.acceptance_by_pos)))
    print(f"mean accepted per pass {out['mean_accepted_per_pass']:.2f}, tokens per pass {out['tokens_per_pass']:.2f}")
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
