"""Speculative decoding speed: `none` against `mtp` at N = 1..8 (and ngram), in one run.

    python benchmarks/spec_bench.py -m MODEL.gguf [-md SIDECAR] [--n-max 8] [--repeats 3] [-n 64] [-t 2]
    python benchmarks/spec_bench.py --tiny glm4moe          # a tiny structured model built on the fly

Greedy decoding over the same prompts for every setting; each cell is the median over repeats of
the total tokens / total generation seconds across prompts (settings interleaved repeat by repeat,
mtp_cli.measure). Prints a table and writes JSON. (`mtp-cli bench` is the product's version:
none, ngram, mtp N=1..4, auto and adaptive.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli.measure import PROMPTS, Setting, interleaved, read_prompts, run_setting  # noqa: E402
from mtp_cli.runtime import GenConfig, Runtime  # noqa: E402


def tiny_model(arch: str, folder: Path) -> Path:
    from gguf_tools.factory import tiny_model_set

    return tiny_model_set(folder, arch, "structured", "q8_0", head_noise=1.0, trunk_mix=2.0)["full"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("-md", "--model-draft", type=Path, default=None, help="MTP sidecar for the mtp rows")
    ap.add_argument("--tiny", choices=["qwen35", "glm4moe"], help="benchmark a tiny structured model instead")
    ap.add_argument("--prompts", type=Path, help="one prompt per line")
    ap.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-ngram", action="store_true")
    ap.add_argument("--adaptive", action="store_true", help="also an adaptive row (fresh controller per repeat)")
    ap.add_argument("--json", type=Path, default=Path("spec_bench.json"))
    args = ap.parse_args()
    if (args.model is None) == (args.tiny is None):
        ap.error("give -m MODEL or --tiny ARCH")
    tmp = tempfile.TemporaryDirectory(prefix="spec_bench.")
    model = args.model or tiny_model(args.tiny, Path(tmp.name))
    texts = PROMPTS if args.prompts is None else read_prompts(args.prompts)
    base = GenConfig(n_predict=args.n_predict, n_threads=args.threads, temp=0.0, n_ctx=2048)
    with Runtime(model, spec_type="mtp", draft_model=args.model_draft) as rt:
        if args.chat:
            from gguf_tools.gguf_file import open_gguf
            from mtp_cli.chat import chat_prompt

            gf = open_gguf(model)
            texts = [chat_prompt(gf, t, *rt.special_texts()) for t in texts]
        prompts = [rt.tokenize(t, parse_special=args.chat) for t in texts]
        settings = [Setting("none", replace(base, spec_type="none"))]
        settings += [Setting(f"mtp N={n}", replace(base, spec_type="mtp", draft_n_max=n))
                     for n in range(1, args.n_max + 1)]
        if not args.no_ngram:
            settings.append(Setting("ngram N=3", replace(base, spec_type="ngram", draft_n_max=3)))
        if args.adaptive:
            from mtp_cli.adaptive import AdaptiveController

            settings.append(Setting("adaptive", replace(base, spec_type="mtp", draft_n_max="adaptive"),
                                    AdaptiveController))
        run_setting(rt, prompts[:1], settings[0].config)  # warm-up: first-touch page faults, thread start
        results = interleaved(rt, prompts, settings, args.repeats)
        rows = {name: r.to_dict() for name, r in results.items()}
        print(f"{'setting':12}{'tok/s':>9}{'x none':>8}{'accept':>8}{'acc/pass':>9}{'tok/pass':>9}"
              f"{'tgt ms':>8}{'dft ms':>8}{'py ms':>7}  acceptance by position")
        for s in settings:
            r = rows[s.name]
            ratio = r["tokens_per_second"] / rows["none"]["tokens_per_second"]
            by_pos = " ".join(f"{a:.2f}" for a in r["acceptance_by_pos"])
            print(f"{s.name:12}{r['tokens_per_second']:9.1f}{ratio:8.2f}{r['acceptance']:8.2f}"
                  f"{r['mean_accepted_per_pass']:9.2f}{r['tokens_per_pass']:9.2f}{r['target_decode_ms_per_step']:8.2f}"
                  f"{r['draft_decode_ms_per_step']:8.2f}{r['python_overhead_ms_per_step']:7.3f}  {by_pos}", flush=True)
    out = {"model": str(args.model or f"tiny {args.tiny}"), "threads": args.threads, "n_predict": args.n_predict,
           "repeats": args.repeats, "prompts": len(prompts), "settings": rows}
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
