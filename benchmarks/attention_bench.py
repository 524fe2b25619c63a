"""What flash attention costs a decode on this machine: batches of 1..32 rows at several depths,
llama.cpp's flash attention on against off, the same context settings otherwise.

    python benchmarks/attention_bench.py [-m MODEL] [-t 2] [--depths 64,256,1024] [--rows 1,2,4,8,16,32]
                                         [--seqs 1] [--rounds 4] [--exactness 12] [--json out.json]

Why it exists: llama.cpp's `-fa auto` turns flash attention on wherever the device has the op, and
on a CPU its kernel reads the KV cache one query row at a time below 64 rows (ggml-cpu ops.cpp: the
tiled path needs 64), so a plain decode and every verify batch pay for it past ~100 positions.
`mtp-cli` resolves auto to off where attention runs on the CPU for one sequence, and measures it for
several (mtp_cli.contexts.flash_attn_for, mtp_cli.attention_probe); this script shows what either
costs on a given CPU with the real model. Per depth, the prompt is decoded into two
contexts (on, off); then for each row count a decode of that many rows at the prompt's end, timed in
blocks (the first of a block, a new graph shape, not timed), rounds interleaved, medians. Printed:
ms per decode with each setting, on / off, and v(rows - 1) (the decode against a one-row decode with
the same setting: what a verify pass costs in plain steps). Without -m: the demo model.

--seqs S: serve's step with S slots: the contexts hold S sequences (llama.cpp's KV split per
sequence, as `serve -np S` creates them), each filled to the depth, and a decode holds `rows` rows
of every sequence (S x rows in all).

--exactness K (a model with an MTP head): what each setting does to greedy exactness. K held-out
prompts, short (the chat template around each) and long (the same after ~500 tokens of other
requests), 128 tokens each: how many texts of `lookup` (N up to 32) and `mtp` N=3 differ from plain
decoding's with the same setting. Batched verify rows equal single rows only where llama.cpp's
attention is batch-invariant (docs/ARCHITECTURE.md §3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.attention_probe import timed  # noqa: E402
from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.speed.runs import prompt_tokens  # noqa: E402

EVAL_PROMPTS = Path(__file__).resolve().parent.parent / "mtp_cli" / "train" / "prompts" / "eval_prompts.txt"
TEXT = "The quick brown fox jumps over the lazy dog, said the teacher to the class of thirty. "
BLOCK = 5  # decodes of one shape in a row (the first not timed)


def at_depth(rt: Runtime, toks: list[int], depth: int, rows: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Both settings at one depth: medians in ms by rows."""
    n_ctx = (depth + max(rows) + 16) * args.seqs
    n_batch = max(512, max(rows) * args.seqs)
    ctxs = {
        on: lx.create_context(
            rt.model,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=args.threads,
            n_seq_max=args.seqs,
            kv=lx.KvOptions(flash_attn=on),
        )
        for on in (True, False)
    }
    try:
        batch = lx.Batch(n_batch)
        for ctx in ctxs.values():
            for s in range(args.seqs):
                for p0 in range(0, depth, 512):
                    batch.clear()
                    batch.add_many(toks[p0 : min(depth, p0 + 512)], p0, seq_id=s, logits_last=True)
                    lx.decode(ctx, batch)
        times: dict[tuple[bool, int], list[float]] = {}
        for r in range(args.rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                for n in rows:
                    times.setdefault((on, n), []).extend(timed(ctxs[on], args.seqs, depth, n, BLOCK))
        ms = {f"{'on' if on else 'off'}:{n}": statistics.median(ts) * 1000 for (on, n), ts in times.items()}
        return {"depth": depth, "ms": ms}
    finally:
        for ctx in ctxs.values():
            ctx.close()


def report(rows: list[int], results: list[dict[str, Any]]) -> None:
    print("| depth | rows | on ms | off ms | on / off | v(rows-1) on | v(rows-1) off |")
    print("|---|---|---|---|---|---|---|")
    for res in results:
        ms = res["ms"]
        for n in rows:
            on, off = ms[f"on:{n}"], ms[f"off:{n}"]
            v_on, v_off = on / ms["on:1"], off / ms["off:1"]
            print(f"| {res['depth']} | {n} | {on:.2f} | {off:.2f} | {on / off:.2f} | {v_on:.2f} | {v_off:.2f} |")


def exactness(rt: Runtime, k: int, threads: int) -> list[dict[str, Any]]:
    """Per attention setting and prompt length: texts of lookup and mtp N=3 unlike plain decoding's."""
    evals = read_prompts(EVAL_PROMPTS)
    short = evals[:: max(1, len(evals) // k)][:k]
    preamble = "Here are some requests people sent me: " + " ".join(evals[1:60:2]) + "\n\nNow, my own request: "
    sets = {"short": prompt_tokens(rt, short, True), "long": prompt_tokens(rt, [preamble + p for p in short], True)}
    base = GenConfig(n_predict=128, n_threads=threads, n_ctx=4096, temp=0.0)
    out = []
    for on in (True, False):
        for name, toks in sets.items():
            row: dict[str, Any] = {"flash_attn": on, "prompts": name, "n": len(toks), "tokens": max(map(len, toks))}
            for spec, n in (("lookup", 32), ("mtp", 3)):
                row[spec] = 0
                for pt in toks:
                    plain = [e.token for e in rt.generate(pt, replace(base, spec_type="none", flash_attn=on))]
                    cfg = replace(base, spec_type=spec, draft_n_max=n, flash_attn=on)
                    row[spec] += [e.token for e in rt.generate(pt, cfg)] != plain
            print(
                f"flash attention {'on ' if on else 'off'}, {row['n']} {name} prompts (up to {row['tokens']} tokens): "
                f"unlike plain decoding: lookup {row['lookup']}, mtp N=3 {row['mtp']}",
                flush=True,
            )
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None, help="default: the demo model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--depths", default="64,256,1024")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--seqs", type=int, default=1, help="sequences (slots), each with `rows` rows per decode")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--exactness", type=int, default=0, help="K prompts: texts unlike plain decoding's")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    rows = sorted({1, *(int(x) for x in args.rows.split(","))})
    lx.quiet_logs()
    if args.model is None:
        from mtp_cli.demo import demo_model

        args.model = demo_model()
    cpu = next((d.description for d in lx.devices() if d.name == "CPU"), "CPU")
    print(f"model {args.model}, {args.threads} threads, {args.seqs} sequence(s), {cpu}")
    with Runtime.load(args.model, spec_type="mtp" if args.exactness else "none") as rt:
        toks = rt.tokenize(TEXT * (1 + (max(depths) + max(rows)) // 16))
        results = [at_depth(rt, toks, d, rows, args) for d in depths]
        report(rows, results)
        flips = exactness(rt, args.exactness, args.threads) if args.exactness else []
    if args.json:
        doc = {"model": str(args.model), "results": results, "exactness": flips}
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
