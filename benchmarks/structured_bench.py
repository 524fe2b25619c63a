"""MTP on structured output: acceptance, tokens per verify pass and speed on free text, on output
constrained by a JSON schema, and on a forced tool call, in one run (the serve path's grammar).

    python benchmarks/structured_bench.py [-m MODEL.gguf] [-N 1 2 3] [--repeats 2] [-n 64] [-t 2]

Default model: the demo (SmolLM2-135M-Instruct adopted, with the shipped trained head). Every workload
runs the same chat prompts; settings (none, mtp at each N) interleave repeat by repeat and each cell
is the median repeat (mtp_cli.speed.runs). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.serve.tools import FORMATS, generic_messages  # noqa: E402
from mtp_cli.session import Session  # noqa: E402
from mtp_cli.speed.runs import PROMPTS, Setting, interleaved, setting_name  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "minutes": {"type": "integer"},
    },
    "required": ["title", "steps", "minutes"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "search_notes",
        "description": "Search the user's notes",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query", "limit"],
        },
    },
}


def workloads(rt: Runtime, prompts: list[str]) -> dict[str, tuple[list[list[int]], str | None]]:
    """name -> (the prompts' tokens, the grammar they run under)."""
    s = Session(rt)
    chat = [[{"role": "user", "content": p}] for p in prompts]
    as_json = [[{"role": "user", "content": p + " Answer in JSON."}] for p in prompts]
    with_tool = [generic_messages(m, [TOOL]) for m in chat]
    return {
        "free text": ([s.chat(m).tokens for m in chat], None),
        "json schema": ([s.chat(m).tokens for m in as_json], lx.json_schema_grammar(SCHEMA)),
        "tool call": ([s.chat(m).tokens for m in with_tool], FORMATS["generic"].rules([TOOL], False)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None)
    ap.add_argument("-N", "--n-values", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4, help="how many of the built-in chat prompts")
    ap.add_argument("--json", type=Path, default=Path("structured_bench.json"))
    args = ap.parse_args()
    lx.quiet_logs()
    if args.model is None:
        from mtp_cli.cli.demo_model import demo_file

        args.model = demo_file()
    base = GenConfig(temp=0.0, n_predict=args.n_predict, n_threads=args.threads, n_ctx=2048)
    out: dict[str, dict] = {}
    with Runtime.load(args.model, spec_type="mtp") as rt:
        for name, (toks, gbnf) in workloads(rt, PROMPTS[: args.prompts]).items():
            cfg = replace(base, grammar=gbnf)
            settings = [Setting("none", cfg)] + [
                Setting(setting_name("mtp", n), replace(cfg, spec_type="mtp", draft_n_max=n)) for n in args.n_values
            ]
            res = interleaved(rt, toks, settings, args.repeats)
            none_tps = res["none"].stats.tokens_per_second
            out[name] = {
                k: {
                    "tokens_per_second": r.stats.tokens_per_second,
                    "ratio_vs_none": r.stats.tokens_per_second / none_tps if none_tps else None,
                    "acceptance": r.stats.acceptance,
                    "acceptance_by_pos": r.stats.acceptance_by_pos,
                    "tokens_per_pass": r.stats.tokens_per_pass,
                    "tokens": r.stats.n_tokens,
                }
                for k, r in res.items()
            }
    print(f"{'workload':12} {'setting':8} {'tok/s':>7} {'vs none':>8} {'accept':>7} {'tok/pass':>9}  by position")
    for name, rows in out.items():
        for k, r in rows.items():
            ratio = f"{r['ratio_vs_none']:.3f}" if r["ratio_vs_none"] else "-"
            pos = " ".join(f"{x:.2f}" for x in r["acceptance_by_pos"])
            print(
                f"{name:12} {k:8} {r['tokens_per_second']:7.1f} {ratio:>8} {r['acceptance']:7.1%} "
                f"{r['tokens_per_pass']:9.2f}  {pos}"
            )
    args.json.write_text(json.dumps({"model": str(args.model), "repeats": args.repeats, "results": out}, indent=2))


if __name__ == "__main__":
    main()
