"""Speculative decoding speed: `none` against `mtp` at N = 1..8 (and ngram), in one run.

    python benchmarks/spec_bench.py -m MODEL.gguf [-md SIDECAR] [--n-max 8] [--repeats 3] [-n 64] [-t 2]
    python benchmarks/spec_bench.py --tiny glm4moe          # a tiny structured model built on the fly
    python benchmarks/spec_bench.py -m M -md HEAD --chat --prompts mtp_cli/train/prompts/eval_prompts.txt \
        --n-max 4 --predict                                  # + the cost model's predicted ratio per N

Greedy decoding over the same prompts for every setting; each cell is the median over repeats of
the total tokens / total generation seconds across prompts (settings interleaved repeat by repeat,
mtp_cli.measure). Prints a table and writes JSON. With --predict it also measures the machine's decode
costs directly after every repeat (T, v(N), c: mtp_cli.speed.probe.measure_costs; element-wise medians,
so the VM's drift hits the costs and the runs alike) and prints the speed ratio those costs and
each row's measured acceptance predict, beside the measured one: a gap means time lost in the loop.
(`mtp-cli bench` is the product's version: none, ngram, mtp N=1..4, auto and adaptive.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.speed.costs import CostModel  # noqa: E402
from mtp_cli.speed.probe import measure_costs  # noqa: E402
from mtp_cli.speed.runs import PROMPTS, Setting, interleaved, run_setting, setting_name  # noqa: E402


def tiny_model(arch: str, folder: Path) -> Path:
    from tests.factory import tiny_model_set

    return tiny_model_set(folder, arch, "structured", "q8_0", head_noise=1.0, trunk_mix=2.0)["full"]


def parse_args() -> argparse.Namespace:
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
    ap.add_argument("--predict", action="store_true", help="measure the cost model; print predicted ratios")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="first run tune (default budget, profile not saved) on the same prompts; its pick joins "
        "the sweep, and its speed is reported against the best fixed setting",
    )
    ap.add_argument("--json", type=Path, default=Path("spec_bench.json"))
    args = ap.parse_args()
    if (args.model is None) == (args.tiny is None):
        ap.error("give -m MODEL or --tiny ARCH")
    if args.predict and args.n_max < 1:
        ap.error("--predict needs --n-max >= 1")
    if args.tune and args.chat:
        ap.error("--tune measures raw prompts (as tune does): drop --chat")
    return args


def sweep(args: argparse.Namespace, base: GenConfig, picked) -> list[Setting]:
    """none, mtp N = 1..n_max, ngram, tune's pick, adaptive: the rows of one run."""
    settings = [Setting("none", replace(base, spec_type="none"))]
    settings += [
        Setting(setting_name("mtp", n), replace(base, spec_type="mtp", draft_n_max=n)) for n in range(1, args.n_max + 1)
    ]
    if not args.no_ngram:
        settings.append(Setting(setting_name("ngram", 3), replace(base, spec_type="ngram", draft_n_max=3)))
    if picked is not None:
        settings.append(Setting(f"tune:{picked.name}", picked.config(base)))
    if args.adaptive:
        from mtp_cli.speed.adaptive import ADAPTIVE_N_MAX, AdaptiveController

        settings.append(
            Setting("adaptive", replace(base, spec_type="mtp", draft_n_max=ADAPTIVE_N_MAX), AdaptiveController)
        )
    return settings


def print_rows(settings: list[Setting], rows: dict) -> None:
    print(
        f"{'setting':12}{'tok/s':>9}{'x none':>8}{'accept':>8}{'acc/pass':>9}{'tok/pass':>9}"
        f"{'tgt ms':>8}{'dft ms':>8}{'py ms':>7}  acceptance by position"
    )
    for s in settings:
        r = rows[s.name]
        ratio = r["tokens_per_second"] / rows["none"]["tokens_per_second"]
        by_pos = " ".join(f"{a:.2f}" for a in r["acceptance_by_pos"])
        print(
            f"{s.name:12}{r['tokens_per_second']:9.1f}{ratio:8.2f}{r['acceptance']:8.2f}"
            f"{r['mean_accepted_per_pass']:9.2f}{r['tokens_per_pass']:9.2f}{r['target_decode_ms_per_step']:8.2f}"
            f"{r['draft_decode_ms_per_step']:8.2f}{r['python_overhead_ms_per_step']:7.3f}  {by_pos}",
            flush=True,
        )


def tune_check(picked, settings: list[Setting], rows: dict) -> dict:
    """Tune's pick against the best fixed setting of the same run."""
    fixed = {
        s.name: rows[s.name]["tokens_per_second"]
        for s in settings
        if s.name == "none" or (s.name.startswith("mtp N=") and s.policy_factory is None)
    }
    best = max(fixed, key=lambda k: fixed[k])
    got = rows[f"tune:{picked.name}"]["tokens_per_second"]
    print(
        f"\ntune's pick {picked.name}: {got:.1f} tok/s; best fixed setting {best}: {fixed[best]:.1f} tok/s "
        f"-> {got / fixed[best]:.3f}x"
    )
    return {
        "picked": picked.name,
        "picked_tps": got,
        "best_fixed": best,
        "best_fixed_tps": fixed[best],
        "ratio": got / fixed[best],
    }


def main() -> None:
    args = parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="spec_bench.")
    model = args.model or tiny_model(args.tiny, Path(tmp.name))
    texts = PROMPTS if args.prompts is None else read_prompts(args.prompts)
    base = GenConfig(n_predict=args.n_predict, n_threads=args.threads, temp=0.0, n_ctx=2048)
    picked = None
    if args.tune:
        from mtp_cli.speed.tune import tune

        tr = tune(model, args.model_draft, prompts=texts, n_threads=args.threads, save=False)
        picked = tr.best
        print(f"tune: {tr.elapsed:.1f} s (budget {tr.budget:g} s), picked {picked.name}", flush=True)
    with Runtime.load(model, spec_type="mtp", draft_model=args.model_draft) as rt:
        if args.chat:
            from mtp_cli.chat import chat_prompt

            texts = [chat_prompt(rt.file, t, *rt.special_texts()) for t in texts]
        prompts = [rt.tokenize(t, parse_special=args.chat) for t in texts]
        settings = sweep(args, base, picked)
        run_setting(rt, prompts[:1], settings[0].config)  # warm-up: first-touch page faults, thread start
        costs: list = []  # with --predict: one cost measurement after every repeat, so drift hits both alike
        done = [0]

        def after_run(name: str, r: int, st) -> None:
            done[0] += 1
            if args.predict and done[0] % len(settings) == 0:
                costs.append(measure_costs(rt, replace(base, spec_type="mtp"), args.n_max, prompts[0], rounds=2))

        results = interleaved(rt, prompts, settings, args.repeats, on_run=after_run)
        rows = {name: r.to_dict() for name, r in results.items()}
        print_rows(settings, rows)
        cost = predict(median_costs(costs), settings, rows) if args.predict else None
    if picked is not None:
        rows["tune_check"] = tune_check(picked, settings, rows)
    out = {
        "model": str(args.model or f"tiny {args.tiny}"),
        "threads": args.threads,
        "n_predict": args.n_predict,
        "repeats": args.repeats,
        "prompts": len(prompts),
        "settings": rows,
        "cost_model": cost,
    }
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    tmp.cleanup()


def median_costs(models: list[CostModel]) -> CostModel:
    """Element-wise medians of cost models measured between the repeats (relative costs: T drifts)."""
    med = statistics.median
    k = min(len(m.draft_rows) for m in models)
    return CostModel(
        t_ms=med(m.t_ms for m in models),
        verify=[med(m.verify[n] for m in models) for n in range(len(models[0].verify))],
        draft=med(m.draft for m in models),
        draft_rows=[med(m.draft_rows[i] for m in models) for i in range(k)],
    )


def predict(cm: CostModel, settings: list[Setting], rows: dict) -> dict:
    """The cost model (decode times only, no loop overhead) and its predicted ratio for each mtp row."""
    T = cm.t_ms
    print(f"\ncost model: plain token T = {T:.2f} ms; draft step c = {cm.draft:.3f} T ({cm.draft * T:.2f} ms)")
    print(f"{'N':>3}{'verify N+1':>12}{'ms':>8}{'tok/pass':>10}{'predicted':>11}{'measured':>10}{'gap':>8}")
    out = {"t_ms": T, "verify": cm.verify, "draft": cm.draft, "draft_rows": cm.draft_rows, "rows": {}}
    none = rows["none"]["tokens_per_second"]
    for s in settings:
        if s.config.spec_type != "mtp" or s.policy_factory is not None:
            continue
        n, r = s.config.draft_n_max, rows[s.name]
        pred = cm.ratio(n, r["acceptance_by_pos"])
        meas = r["tokens_per_second"] / none
        out["rows"][s.name] = {"n": n, "verify": cm.verify[n], "predicted_ratio": pred, "measured_ratio": meas}
        print(
            f"{n:3d}{cm.verify[n]:11.2f}T{cm.verify[n] * T:8.2f}{r['tokens_per_pass']:10.2f}{pred:10.2f}x"
            f"{meas:9.2f}x{(meas - pred) / pred:+8.1%}",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
