"""Several sequences batched through the library (mtp_cli.slots.BatchRunner, what `serve -np S` runs,
without HTTP), per draft setting: aggregate tok/s, the drafts verified while others shared the decode,
acceptance, and each setting's ratio to plain batched decoding, paired repeat by repeat.

    python benchmarks/batch_bench.py [-m MODEL] [-ngl N] [--slots 4] [--settings none,3,auto]
                                     [--repeats 3] [--max-tokens 64] [--waves 2] [-t 2] [--json out.json]

Each repeat runs every setting in turn: `--waves` waves of `--slots` chat prompts (the built-in
evaluation prompts, greedy) started together. `none` decodes plainly; a number forces the MTP head's
N (`3/apart`: the same with every slot's head decoding alone, not in one decode for all); `auto` is
`serve`'s default (lookup,mtp, an AutoDraft per slot kept across repeats, gated: beside others a
slot drafts only what pays for its rows, mtp_cli.load). Without -m: the demo model.
The GPU check (benchmarks/gpu) runs it at -ngl 99, where rows are cheap and drafting beside others
may pay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.session import Session  # noqa: E402
from mtp_cli.slots import BatchRunner  # noqa: E402
from mtp_cli.speed.auto import AutoDraft  # noqa: E402
from mtp_cli.speed.runs import PROMPTS  # noqa: E402

SPEC = "lookup,mtp"  # (serve's default with a head: every setting runs on the one runtime)
APART = "/apart"  # (a setting's suffix: its slots' heads decode apart)


def _start(rt: Runtime, runner: BatchRunner, setting: str, seq: int, prompt: str, base: GenConfig, auto: AutoDraft):
    ses = Session(rt, seq)
    p = ses.chat([{"role": "user", "content": prompt}])
    if setting == "auto":
        res = auto.resolve(replace(base, spec_type=SPEC, draft_mode="auto"))
        return runner.add(ses.prepare(p, res.config, res.policy)[0], gate=True)
    cfg = (
        replace(base, spec_type="none")
        if setting == "none"
        else replace(base, spec_type="mtp", draft_n_max=int(setting.removesuffix(APART)))
    )
    return runner.add(ses.prepare(p, cfg)[0])


def run_setting(
    rt: Runtime, runner: BatchRunner, setting: str, base: GenConfig, autos: list[AutoDraft], waves: int, shift: int
) -> dict[str, Any]:
    """`waves` waves of one prompt per slot, batched: tokens, seconds, drafts (all, and while shared)."""
    n_slots = len(autos)
    tok = drafted = accepted = shared = 0
    t0 = time.perf_counter()
    for w in range(waves):
        stats = [
            _start(rt, runner, setting, s, PROMPTS[(w * n_slots + s + shift) % len(PROMPTS)], base, autos[s])
            for s in range(n_slots)
        ]
        while runner.running:
            both = len(runner.running) > 1
            before = sum(st.n_drafted for st in stats)
            tok += sum(len(o.events) for o in runner.step().values())
            shared += sum(st.n_drafted for st in stats) - before if both else 0
        drafted += sum(st.n_drafted for st in stats)
        accepted += sum(st.n_accepted for st in stats)
    dt = time.perf_counter() - t0
    return {"tokens": tok, "seconds": dt, "drafted": drafted, "accepted": accepted, "drafted_shared": shared}


def sweep(
    model: str,
    settings: list[str],
    *,
    slots: int = 4,
    repeats: int = 3,
    max_tokens: int = 64,
    waves: int = 2,
    n_gpu_layers: int = 0,
    n_threads: Optional[int] = None,
) -> dict[str, Any]:
    """Every setting, `repeats` times in turn; per setting the median tok/s and the paired ratio to none."""
    base = GenConfig(n_predict=max_tokens, temp=0.0, n_threads=n_threads, n_ctx=1024 * slots)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    with Runtime.load(model, spec_type=SPEC, n_parallel=slots, n_gpu_layers=n_gpu_layers) as rt:
        autos = [AutoDraft(rt) for _ in range(slots)]
        # (each keeps its slots' drafting records)
        runners = {s: BatchRunner(rt, joint=not s.endswith(APART)) for s in settings}
        for rep in range(repeats):
            for s in settings:
                runs[s].append(run_setting(rt, runners[s], s, base, autos, waves, rep))
    rows = []
    for s in settings:
        rs = runs[s]
        tps = [r["tokens"] / r["seconds"] for r in rs]
        ratio = None
        if "none" in runs:
            plain = [r["tokens"] / r["seconds"] for r in runs["none"]]
            ratio = statistics.median(a / b for a, b in zip(tps, plain))
        d, a = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
        rows.append(
            {
                "setting": s,
                "tok_s": statistics.median(tps),
                "x_none": ratio,
                "drafted": d,
                "drafted_shared": sum(r["drafted_shared"] for r in rs),
                "acceptance": a / d if d else None,
            }
        )
    return {"slots": slots, "repeats": repeats, "max_tokens": max_tokens, "waves": waves, "rows": rows, "runs": runs}


def table(doc: dict[str, Any]) -> str:
    out = [
        f"{doc['slots']} slots batched, {doc['waves']} waves x {doc['max_tokens']} tokens, medians of {doc['repeats']}"
    ]
    out.append(f"{'setting':10}{'tok/s':>9}{'x none':>8}{'drafted':>9}{'shared':>8}{'accept':>8}")
    for r in doc["rows"]:
        x = f"{r['x_none']:.2f}" if r["x_none"] is not None else "-"
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        out.append(f"{r['setting']:10}{r['tok_s']:9.1f}{x:>8}{r['drafted']:9d}{r['drafted_shared']:8d}{acc:>8}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-ngl", "--n-gpu-layers", dest="ngl", type=int, default=0)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--settings", default="none,3,auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.model is None:
        from mtp_cli.demo import demo_model

        args.model = str(demo_model())
    doc = sweep(
        args.model,
        args.settings.split(","),
        slots=args.slots,
        repeats=args.repeats,
        max_tokens=args.max_tokens,
        waves=args.waves,
        n_gpu_layers=args.ngl,
        n_threads=args.threads,
    )
    print(table(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
