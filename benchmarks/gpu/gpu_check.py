"""The GPU check's measurements (run by run.sh; also runs on a CPU with -ngl 0): what llama.cpp sees,
the cost model (T, v(N) for N = 1..8, c), `mtp-cli bench` and `tune --no-save`, decode-time
acceptance on the evaluation prompts, and 4 slots batched (benchmarks/batch_bench.py: plain, N = 3
forced with the slots' heads in one decode per draft position and apart, and auto, which drafts
beside other slots only where that pays). One JSON file, and a table printed.

    python benchmarks/gpu/gpu_check.py -m demo.gguf -ngl 99 --out results.json [--quick]

--quick (for the CPU test of the scripts): fewer prompts, repeats and tuning seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import batch_bench  # noqa: E402

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.chat import chat_prompt  # noqa: E402
from mtp_cli.config import GenConfig, LoadConfig  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.speed.bench import bench  # noqa: E402
from mtp_cli.speed.probe import measure_costs  # noqa: E402
from mtp_cli.speed.runs import PROMPTS  # noqa: E402
from mtp_cli.speed.tune import tune  # noqa: E402
from mtp_cli.stats import GenStats  # noqa: E402

EVAL_PROMPTS = Path(__file__).resolve().parents[2] / "mtp_cli" / "train" / "prompts" / "eval_prompts.txt"


def costs(model: Path, ngl: int, n_threads: int | None) -> dict[str, Any]:
    cfg = GenConfig(n_threads=n_threads, temp=0.0, n_ctx=2048)
    with Runtime.load(model, spec_type="mtp", n_gpu_layers=ngl) as rt:
        prompt = rt.tokenize(chat_prompt(rt.file, PROMPTS[0], *rt.special_texts()), parse_special=True)
        cm = measure_costs(rt, cfg, 8, prompt * 4)
    return {"T_ms": cm.t_ms, "v": cm.verify, "c": cm.draft, "c_rows": cm.draft_rows}


def acceptance(model: Path, ngl: int, n_threads: int | None, prompts: list[str], n: int) -> dict[str, Any]:
    """Greedy decoding with the head at N = 3 over the prompts (chat template): pooled figures."""
    cfg = GenConfig(spec_type="mtp", draft_n_max=3, n_predict=n, n_threads=n_threads, temp=0.0)
    runs = []
    with Runtime.load(model, spec_type="mtp", n_gpu_layers=ngl) as rt:
        for p in prompts:
            toks = rt.tokenize(chat_prompt(rt.file, p, *rt.special_texts()), parse_special=True)
            for _ in rt.generate(toks, cfg):
                pass
            assert rt.stats is not None
            runs.append(rt.stats)
    st = GenStats.pooled(runs)
    return {
        "prompts": len(prompts),
        "acceptance": st.acceptance,
        "acceptance_by_pos": st.acceptance_by_pos,
        "tokens_per_pass": st.tokens_per_pass,
        "tokens_per_second": st.tokens_per_second,
    }


def table(doc: dict[str, Any]) -> str:
    out = [f"devices: {', '.join(d['name'] + ' ' + d['description'] for d in doc['devices'])}; -ngl {doc['ngl']}"]
    c = doc["costs"]
    out.append(
        f"cost model: T = {c['T_ms']:.3f} ms; v(N) = "
        + " ".join(f"{v:.2f}" for v in c["v"][1:])
        + f" (N = 1..{len(c['v']) - 1}); c = {c['c']:.2f} T"
    )
    out.append(f"{'setting':14}{'tok/s':>9}{'x none':>8}{'accept':>8}{'tok/pass':>9}")
    for r in doc["bench"]["rows"]:
        if r.get("skipped"):
            continue
        ratio = f"{r['ratio_vs_none']:.2f}" if r.get("ratio_vs_none") is not None else "-"
        out.append(
            f"{r['name']:14}{r['tokens_per_second']:9.1f}{ratio:>8}{r['acceptance']:8.2f}{r['tokens_per_pass']:9.2f}"
        )
    t = doc["tune"]
    out.append(f"tune: best {t['best']} ({t['best_ratio']}x none) in {t['elapsed']:.0f} s")
    a = doc["acceptance"]
    out.append(
        f"acceptance at N=3 on {a['prompts']} evaluation prompts: {a['acceptance']:.3f}, by position "
        + " ".join(f"{x:.2f}" for x in a["acceptance_by_pos"])
        + f"; {a['tokens_per_pass']:.2f} tokens per pass"
    )
    if "slots" in doc:
        out.append(batch_bench.table(doc["slots"]))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("-ngl", "--n-gpu-layers", dest="ngl", type=int, default=99)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    lx.quiet_logs()
    t0 = time.perf_counter()
    evals = read_prompts(EVAL_PROMPTS)
    doc: dict[str, Any] = {"ngl": args.ngl, "model": str(args.model), "quick": args.quick}
    doc["gpu_offload"] = lx.supports_gpu_offload()
    doc["devices"] = [asdict(d) for d in lx.devices()]
    doc["system"] = lx.system_info()
    print("measuring the cost model", flush=True)
    doc["costs"] = costs(args.model, args.ngl, args.threads)
    print("bench", flush=True)
    b = bench(args.model, LoadConfig(n_gpu_layers=args.ngl), n_threads=args.threads, repeats=1 if args.quick else 3)
    doc["bench"] = b.to_dict()
    print("tune", flush=True)
    t = tune(
        args.model,
        LoadConfig(n_gpu_layers=args.ngl),
        budget=20 if args.quick else 60,
        n_threads=args.threads,
        save=False,
    )
    best = t.best
    doc["tune"] = {
        "best": best.name if best else None,
        "best_ratio": round(best.ratio, 3) if best and best.ratio else None,
        "elapsed": t.elapsed,
        "result": t.to_dict(),
    }
    print("acceptance", flush=True)
    doc["acceptance"] = acceptance(args.model, args.ngl, args.threads, evals[:6] if args.quick else evals, 128)
    print("slots", flush=True)
    doc["slots"] = batch_bench.sweep(
        str(args.model),
        ["none", "3", "3/apart", "auto"],
        slots=4,
        repeats=1 if args.quick else 3,
        n_gpu_layers=args.ngl,
        n_threads=args.threads,
    )
    doc["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str))
    print(table(doc))
    print(f"wrote {args.out} ({doc['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
