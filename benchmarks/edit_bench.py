"""Edit work against free text: which drafter pays where, on this machine.

    python benchmarks/edit_bench.py [-m MODEL] [--settings none,mtp,ngram,auto] [-n 128] [--repeats 3]
                                    [-t 2] [--free 6] [--json out.json]

Two prompt sets through the chat template, greedy, `--repeat-penalty 1` (none, or as given): the edit
prompts (benchmarks/edit_prompts.json: copy, fix, rename, reformat, quote, code edits, written for
this benchmark) and `--free` of the held-out evaluation prompts (free text). Every setting runs on
both, repeats interleaved (the order rotated), medians; per set and setting: tok/s, the ratio to
`none` in the same run, tokens per verify pass, and each edit kind's ratio. Without -m: the demo
model. Settings:

    none        plain decoding
    mtp         the MTP head at N=3 (skipped without a head)
    ngram       prompt lookup at a fixed N=8 (`--spec-type ngram --spec-draft-n-max 8`)
    lookup      text lookup, its length from the match (`--spec-type lookup --spec-draft-n-max 32`)
    mtp-auto    the head alone under `--spec-draft-n-max auto` (the demo's default before lookups)
    auto        what `mtp-cli generate -m MODEL` drafts with no drafting flags (speed.auto.default_spec,
                N auto: the lookup chained with the head)
    NAME+fa     any of these with flash attention on (mtp-cli's default on a CPU is off)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli import drafters  # noqa: E402
from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.config import DRAFT_N_MAX_LIMIT, GenConfig  # noqa: E402
from mtp_cli.errors import NoMtpHeadError  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.speed.adaptive import AdaptiveController  # noqa: E402
from mtp_cli.speed.auto import AutoDraft, default_spec  # noqa: E402
from mtp_cli.speed.runs import RunResult, Setting, interleaved, prompt_tokens, warm_up  # noqa: E402

EDIT_PROMPTS = Path(__file__).with_name("edit_prompts.json")
# (not through mtp_cli.train: importing it marks the process as running torch, which turns llama.cpp's
# AMX path off, and a plain token here costs twice as much)
EVAL_PROMPTS = Path(__file__).resolve().parent.parent / "mtp_cli" / "train" / "prompts" / "eval_prompts.txt"


def auto_setting(name: str, spec: Callable[[Runtime], str]) -> Callable[[Runtime, GenConfig], Setting | None]:
    """`--spec-draft-n-max auto` for a spec type: under the tuned profile, else adaptive (a fresh
    controller per repeat, as a new process would have)."""

    def make(rt: Runtime, base: GenConfig) -> Setting | None:
        s = spec(rt)
        if not rt.can_run(s):
            return None
        res = AutoDraft(rt).resolve(replace(base, spec_type=s, draft_mode="auto"))
        if res.controller is None:
            fixed = res.policy
            return Setting(name, res.config, (lambda: fixed) if fixed is not None else None)
        n_max = res.controller.n_max
        return Setting(name, res.config, lambda: AdaptiveController(n_max))

    return make


def has_head(rt: Runtime) -> bool:
    return rt.can_run(drafters.get("mtp"))


SETTINGS: dict[str, Callable[[Runtime, GenConfig], Setting | None]] = {
    "none": lambda rt, b: Setting("none", replace(b, spec_type="none")),
    "mtp": lambda rt, b: Setting("mtp", replace(b, spec_type="mtp", draft_n_max=3)) if has_head(rt) else None,
    "ngram": lambda rt, b: Setting("ngram", replace(b, spec_type="ngram", draft_n_max=8)),
    "lookup": lambda rt, b: Setting("lookup", replace(b, spec_type="lookup", draft_n_max=DRAFT_N_MAX_LIMIT)),
    "mtp-auto": auto_setting("mtp-auto", lambda rt: "mtp" if has_head(rt) else "none"),
    "auto": auto_setting("auto", lambda rt: default_spec(rt.model_path, rt.draft_path)),
}


def load(model: Path) -> Runtime:
    try:
        return Runtime.load(model, spec_type="mtp")
    except NoMtpHeadError:
        return Runtime.load(model, spec_type="none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None, help="default: the demo model")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"of {', '.join(SETTINGS)}")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--free", type=int, default=6, help="free-text prompts (held-out evaluation prompts)")
    ap.add_argument("--json", type=Path, default=Path("edit_bench.json"))
    ap.add_argument("--repeat-penalty", type=float, default=1.0, help="1.1: the demo's own setting")
    args = ap.parse_args()
    lx.quiet_logs()
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in names if s.removesuffix("+fa") not in SETTINGS]
    if bad:
        raise SystemExit(f"--settings: unknown {bad[0]!r} (of {', '.join(SETTINGS)})")
    if args.model is None:
        from mtp_cli.demo import demo_model

        args.model = demo_model()
    edits = json.loads(EDIT_PROMPTS.read_text())["prompts"]
    free = read_prompts(EVAL_PROMPTS)[:: max(1, 60 // max(1, args.free))][: args.free]
    base = GenConfig(
        n_predict=args.n_predict, n_threads=args.threads, n_ctx=2048, temp=0.0, repeat_penalty=args.repeat_penalty
    )
    t0 = time.perf_counter()
    out: dict[str, Any] = {"model": str(args.model), "n_predict": args.n_predict, "repeats": args.repeats, "sets": {}}
    with load(args.model) as rt:
        settings = [s for s in (make_setting(rt, base, n) for n in names) if s is not None]
        sets = {
            "edit": (prompt_tokens(rt, [p["prompt"] for p in edits], True), [p["kind"] for p in edits]),
            "free": (prompt_tokens(rt, free, True), ["free"] * len(free)),
        }
        warm_up(rt, sets["free"][0], base)
        for set_name, (toks, kinds) in sets.items():
            out["sets"][set_name] = measure(rt, toks, kinds, settings, args)
            print(f"{set_name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    out["seconds"] = time.perf_counter() - t0
    report(out)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


def make_setting(rt: Runtime, base: GenConfig, name: str) -> Setting | None:
    """A setting by name; NAME+fa: the same with flash attention on (llama.cpp's auto on a CPU, which
    mtp-cli resolves to off there: the default before that)."""
    if not name.endswith("+fa"):
        return SETTINGS[name](rt, base)
    s = SETTINGS[name.removesuffix("+fa")](rt, replace(base, flash_attn=True))
    return replace(s, name=name) if s is not None else None


def measure(rt: Runtime, toks: list[list[int]], kinds: list[str], settings: list[Setting], args) -> dict[str, Any]:
    """The pooled run over every prompt, and per kind (each kind's prompts on their own, same repeats)."""
    pooled = interleaved(rt, toks, settings, args.repeats)
    rows: dict[str, Any] = {s.name: row(pooled[s.name], pooled["none"]) for s in settings}
    by_kind: dict[str, dict[str, float | None]] = {}
    if len(set(kinds)) > 1:
        for kind in dict.fromkeys(kinds):
            sub = [t for t, k in zip(toks, kinds) if k == kind]
            res = interleaved(rt, sub, settings, args.repeats)
            by_kind[kind] = {s.name: ratio(res[s.name], res["none"]) for s in settings}
    return {"rows": rows, "by_kind": by_kind}


def ratio(r: RunResult, none: RunResult) -> float | None:
    return r.tokens_per_second / none.tokens_per_second if none.tokens_per_second > 0 else None


def row(r: RunResult, none: RunResult) -> dict[str, Any]:
    return {**r.to_dict(), "ratio": ratio(r, none), "spread": r.spread}


def report(out: dict[str, Any]) -> None:
    for set_name, res in out["sets"].items():
        print(f"\n{set_name} ({out['n_predict']} tokens, {out['repeats']} repeats, medians)")
        print("| setting | tok/s | x none | tokens / pass | spread |")
        print("|---|---|---|---|---|")
        for name, r in res["rows"].items():
            x = f"{r['ratio']:.2f}" if r["ratio"] else "-"
            print(f"| {name} | {r['tokens_per_second']:.1f} | {x} | {r['tokens_per_pass']:.2f} | {r['spread']:.1%} |")
        if res["by_kind"]:
            names = list(res["rows"])
            print("| kind | " + " | ".join(names) + " |")
            print("|---" * (len(names) + 1) + "|")
            for kind, xs in res["by_kind"].items():
                cells = " | ".join(f"{xs[n]:.2f}" if xs[n] else "-" for n in names)
                print(f"| {kind} | {cells} |")


if __name__ == "__main__":
    main()
