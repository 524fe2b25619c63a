"""The text lookup's draft-length rules, replayed on recorded greedy answers with measured costs.

    python benchmarks/lookup_sim.py [-m MODEL] [-n 128] [-t 2] [--overhead 0.02] [--switch 0.15]
                                    [--answers answers.json] [--json out.json]

Greedy output does not depend on what is drafted (drafts are verified), so a rule can be replayed
on the plain answers: each step the rule drafts from the text so far, the answer says how many of
its tokens are kept, and the step costs v(d) + overhead plain tokens (v measured here on the same
model and threads: a target decode of d+1 tokens against one, in steady blocks, medians), plus
`--switch` plain tokens for a step whose batch differs from the last one's (llama.cpp rebuilds its
graph then). The speed ratio of a rule is tokens / the steps' summed cost, against plain
decoding's 1 + overhead a token; with no timing noise, rules can be compared at a glance.
`--answers FILE` keeps the recorded answers, v and the end-of-generation ids there (and reads them
back when the file exists), so rules written later compare on the same data. Rules:

    lookup      mtp_cli.drafters.lookup as it is (first token and later ones apart, the track record)
    one-rate    the same with one rate for every token of a copy (first and later counts pooled)
    2L          draft twice the match length, at most 16, where the match is at least 2 (a fixed rule)
    oracle      draft exactly what will be kept (a bound, not a rule)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.contexts import flash_attn_for  # noqa: E402
from mtp_cli.drafters.lookup import LookupDrafter  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.speed.runs import prompt_tokens  # noqa: E402
from mtp_cli.step_costs import StepCosts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EDIT_PROMPTS = ROOT / "benchmarks" / "edit_prompts.json"
EVAL_PROMPTS = ROOT / "mtp_cli" / "train" / "prompts" / "eval_prompts.txt"  # (not via mtp_cli.train: AMX)
D_MAX = 32


class Table(StepCosts):
    """Fixed costs: v(d) as measured once."""

    def __init__(self, v: list[float]):
        super().__init__()
        self.table = v

    def v(self, k: int) -> float:
        return self.table[min(k, len(self.table) - 1)] if k > 0 else 1.0


def measure_v(rt: Runtime, prompt: list[int], threads: int, rounds: int = 4, block: int = 6) -> list[float]:
    """v(d), d = 0..D_MAX: a decode of d+1 tokens at the prompt's end against one token's, each d
    timed in blocks of consecutive decodes (a changed batch shape rebuilds llama.cpp's graph: the
    first of a block is not timed), the order of d rotated each round; medians."""
    fa = flash_attn_for(GenConfig(), rt.fa_auto_off)  # (as the runtime's own contexts: off on a CPU)
    ctx = lx.create_context(rt.model, n_ctx=2048, n_batch=512, n_threads=threads, kv=lx.KvOptions(flash_attn=fa))
    try:
        b = lx.Batch(512)
        b.add_many(prompt, 0, logits_last=True)
        lx.decode(ctx, b)
        times: list[list[float]] = [[] for _ in range(D_MAX + 1)]
        for r in range(rounds):
            order = list(range(D_MAX + 1))
            order = order[r * 7 % len(order) :] + order[: r * 7 % len(order)]
            for d in order:
                for i in range(block + 1):
                    b.clear()
                    for j in range(d + 1):
                        b.add(prompt[(j * 7) % len(prompt)], len(prompt) + j, logits=True)
                    t = time.perf_counter()
                    lx.decode(ctx, b)
                    if i:
                        times[d].append(time.perf_counter() - t)
                    lx.memory_seq_rm(ctx, 0, len(prompt), -1)
        t0 = statistics.median(times[0])
        return [statistics.median(ts) / t0 for ts in times]
    finally:
        ctx.close()


class OneRate(LookupDrafter):
    def odds(self, length: int, start: int) -> tuple[float, float]:
        b = self.record(length, start)
        (k1, f1), (k2, f2) = self.first[b], self.later[b]
        a = (k1 + k2) / (k1 + f1 + k2 + f2)
        return a, a


class TwiceL(LookupDrafter):
    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        out = super().draft(id_last, pos, 0)  # (keeps the history)
        L, start = self.match()
        if start < 0 or L < 2:
            return out
        h, n = self.hist, len(self.hist)
        d = min(2 * L, 16, n_max)
        copy: list[int] = []
        for i in range(d):
            j = start + i
            t = h[j] if j < n else copy[j - n]
            if t in self.stop:
                break
            copy.append(t)
        return copy


def replay(
    make: Callable[[], LookupDrafter],
    cases: list[tuple[list[int], list[int]]],
    v: list[float],
    o: float,
    oracle=False,
    switch: float = 0.0,
):
    tokens, cost, steps, drafted = 0, 0.0, 0, 0
    prev = 0
    d = make()  # (one for the set: its track record carries over, as the runtime's drafter's does)
    for prompt, answer in cases:
        d.begin(prompt)
        i = 0  # answer[i] is id_last; the target holds prompt + answer[:i]
        while i < len(answer) - 1:
            drafts = d.draft(answer[i], len(prompt) + i, min(D_MAX, len(answer) - 1 - i))
            truth = answer[i + 1 :]
            if oracle:  # exactly what will be kept
                L, start = d.match()
                drafts = []
                if start >= 0:
                    h = d.hist
                    k = 0
                    while k < len(truth) and k < D_MAX and start + k < len(h) and h[start + k] == truth[k]:
                        k += 1
                    drafts = truth[:k]
                    best = max(range(k + 1), key=lambda x: (x + 1) / (v[x] + o))
                    drafts = drafts[:best]
            a = 0
            while a < len(drafts) and drafts[a] == truth[a]:
                a += 1
            d.accept(a, drafts)
            tokens += a + 1
            cost += v[len(drafts)] + o + (switch if len(drafts) != prev else 0.0)
            prev = len(drafts)
            steps += 1
            drafted += len(drafts)
            i += a + 1
    return tokens, cost, steps, drafted


def record(model: Path, edits: list[str], free: list[str], args) -> tuple[dict[str, Any], list[float], list[int]]:
    """The greedy answers of both sets (plain decoding), v(d) on this machine, the end-of-generation ids."""
    cfg = GenConfig(n_predict=args.n_predict, n_ctx=2048, n_threads=args.threads, temp=0.0, repeat_penalty=1.0)
    with Runtime.load(model) as rt:
        sets: dict[str, list[tuple[list[int], list[int]]]] = {}
        for name, texts in (("edit", edits), ("free", free)):
            toks = prompt_tokens(rt, texts, True)
            sets[name] = [(t, [ev.token for ev in rt.generate(t, cfg)]) for t in toks]
        return sets, measure_v(rt, sets["edit"][0][0], args.threads), lx.eog_tokens(rt.model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--free", type=int, default=12)
    ap.add_argument("--overhead", type=float, default=0.02, help="per-step Python cost, in plain tokens")
    ap.add_argument("--switch", type=float, default=0.0, help="a step whose batch differs from the last one's")
    ap.add_argument("--json", type=Path, default=Path("lookup_sim.json"))
    ap.add_argument("--answers", type=Path, default=None, help="keep the answers and v here; reuse them if there")
    args = ap.parse_args()
    lx.quiet_logs()
    if args.model is None:
        from mtp_cli.demo import demo_model

        args.model = demo_model()
    edits = json.loads(EDIT_PROMPTS.read_text())["prompts"]
    free = read_prompts(EVAL_PROMPTS)[:: max(1, 60 // args.free)][: args.free]
    if args.answers is not None and args.answers.exists():
        kept = json.loads(args.answers.read_text())
        sets, v, stop = kept["sets"], kept["v"], kept["stop"]
    else:
        sets, v, stop = record(args.model, [p["prompt"] for p in edits], free, args)
        if args.answers is not None:
            args.answers.write_text(json.dumps({"sets": sets, "v": v, "stop": stop}))
    print("v(d): " + " ".join(f"{d}:{x:.2f}" for d, x in enumerate(v) if d in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)))
    o = args.overhead
    rules: dict[str, Any] = {
        "lookup": lambda: LookupDrafter(Table(v), stop=stop),
        "one-rate": lambda: OneRate(Table(v), stop=stop),
        "2L": lambda: TwiceL(Table(v), stop=stop),
    }
    out: dict[str, Any] = {"v": v, "overhead": o, "results": {}}
    print("| rule | " + " | ".join(sets) + " |")
    print("|---" * (len(sets) + 1) + "|")
    for name, make in [*rules.items(), ("oracle", rules["lookup"])]:
        cells = []
        for set_name, cases in sets.items():
            tokens, cost, steps, drafted = replay(make, cases, v, o, oracle=name == "oracle", switch=args.switch)
            ratio = tokens * (1 + o) / cost
            res = {"ratio": ratio, "tokens": tokens, "cost": cost, "steps": steps, "drafted": drafted}
            out["results"].setdefault(name, {})[set_name] = res
            cells.append(f"{ratio:.3f} ({tokens / steps:.2f} tok/pass, {drafted / steps:.1f} drafted/pass)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
