"""`serve_bench.py --slots C,...`: at each client count C, `mtp-cli serve -np 1` against `-np C` (and
llama.cpp's llama-server likewise, with --llama-server), the same prompts, context and threads:
aggregate tok/s, time to first token, tok/s over the same server's plain decoding pair by pair
(x none), and each slot's acceptance by draft position beside the same prompts' figures served one
at a time. Run through serve_bench.py (its request checking)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent


def _pool(outcomes: list[Any]) -> list[float]:
    """Acceptance by draft position pooled over these requests."""
    n = max((len(o.drafted_by_pos) for o in outcomes), default=0)
    d, a = [0] * n, [0] * n
    for o in outcomes:
        for i, (x, y) in enumerate(zip(o.drafted_by_pos, o.accepted_by_pos)):
            d[i], a[i] = d[i] + x, a[i] + y
    return [y / x for x, y in zip(d, a) if x]


def by_slot(outcomes: list[Any], alone: Optional[list[Any]] = None) -> dict[int, dict[str, Any]]:
    """Each slot's acceptance by draft position over its requests, and (with `alone`: the same
    prompts served one at a time) the same prompts' single-stream figures and the largest gap."""
    slots: dict[int, list[Any]] = {}
    for o in outcomes:
        if o.ok and o.slot is not None and any(o.drafted_by_pos):
            slots.setdefault(o.slot, []).append(o)
    out: dict[int, dict[str, Any]] = {}
    for s, outs in sorted(slots.items()):
        out[s] = {"acceptance_by_pos": _pool(outs)}
        if alone:
            # (every alone run of each prompt: a prompt's figures depend on what the memory held before it)
            ref = [a for o in outs for a in alone if a.ok and a.prompt == o.prompt]
            single = _pool(ref)
            gap = max((abs(x - y) for x, y in zip(out[s]["acceptance_by_pos"], single)), default=0.0)
            out[s].update(single_stream=single, max_gap=gap)
    return out


def sweep(
    model: str,
    prompts: list[str],
    refs: dict[bool, list[str]],
    args: argparse.Namespace,
    run_setting: Callable[..., Any],
) -> None:
    """--slots: at each client count C, -np 1 and -np C (ours, and llama-server's with --llama-server),
    each run `--repeats` times in turn; a row per server: medians over the repeats."""
    llama = None
    if args.llama_server:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from vs_llama_cpp import _llama_build

        llama = _llama_build().build_tools(("llama-server",), Path.home() / ".cache" / "mtp-cli") / "llama-server"
    rows: list[dict[str, Any]] = []
    for c in [int(x) for x in args.slots.split(",")]:
        args.clients = c
        servers = [("mtp-cli", s.strip(), n) for s in args.settings.split(",") for n in sorted({1, c})]
        if llama is not None:
            servers += [("llama-server", s.strip(), n) for s in args.llama_settings.split(",") for n in sorted({1, c})]
        runs: dict[tuple[str, str, int], list[tuple[Any, list[Any]]]] = {k: [] for k in servers}
        for _ in range(args.repeats):  # (in turn: the machine's drift falls on every server alike)
            for kind, setting, n in servers:
                got = run_setting(model, setting, prompts, refs, args, n, llama if kind == "llama-server" else None)
                runs[(kind, setting, n)].append(got)
                print(
                    f"  {c} clients, {kind} -np {n} {setting}: {got[0].ok}/{got[0].requests} ok, "
                    f"{got[0].overall_tps:.1f} tok/s",
                    flush=True,
                )
        rows += [_row(c, k, v, runs.get((k[0], k[1], 1)), runs.get(_plain(k))) for k, v in runs.items()]
    _print(rows)
    if args.json:
        doc = {"model": model, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=2))


def _plain(key: tuple[str, str, int]) -> tuple[str, str, int]:
    """The plain-decoding run a setting is paired with: the same server, -np and attention suffix."""
    kind, setting, n = key
    attn = setting.partition("+")[2]
    return kind, "none+" + attn if attn else "none", n


def _row(
    c: int, key: tuple[str, str, int], got: list[tuple[Any, list[Any]]], alone: Optional[list], plain: Optional[list]
) -> dict[str, Any]:
    """One server's row: the medians of its repeats, its slots' acceptance over every repeat, and its
    tok/s over `plain`'s (the same server, -np and attention with setting none), pair by pair: repeats run in
    turn, so a pair shares the machine's state of the moment (its spread is 10-20% between moments)."""
    kind, setting, n = key
    res = [r for r, _ in got]
    outs = [o for _, os in got for o in os]
    single = [o for _, os in alone for o in os] if alone and n > 1 else None
    row: dict[str, Any] = {"clients": c, "server": kind, "np": n, "setting": setting, "repeats": len(res)}
    row.update({k: statistics.median(getattr(r, k) for r in res) for k in ("overall_tps", "ttft_p50", "ttft_p95")})
    row.update(
        ok=sum(r.ok for r in res), requests=sum(r.requests for r in res), mismatches=sum(r.mismatches for r in res)
    )
    row["tps_each"] = [r.overall_tps for r in res]
    pairs = [r.overall_tps / p.overall_tps for r, (p, _) in zip(res, plain or []) if p.overall_tps]
    row["x_none_each"] = pairs
    row["x_none"] = statistics.median(pairs) if pairs else None
    row["acceptance_by_slot"] = by_slot(outs, single)
    return row


def _print(rows: list[dict[str, Any]]) -> None:
    print(
        "clients  server         -np  setting  ok/req  mismatch  all tok/s  x -np 1  x none  ttft p50/p95 s  "
        "acceptance by slot (pos 1..3; alone: the same prompts one at a time)"
    )
    for r in rows:
        base = next(
            x
            for x in rows
            if (x["clients"], x["server"], x["setting"], x["np"]) == (r["clients"], r["server"], r["setting"], 1)
        )
        ratio = r["overall_tps"] / base["overall_tps"] if base["overall_tps"] else float("nan")
        acc = "; ".join(
            f"{s}: "
            + "/".join(f"{x:.2f}" for x in v["acceptance_by_pos"][:3])
            + (
                f" (alone {'/'.join(f'{x:.2f}' for x in v['single_stream'][:3])}, gap {v['max_gap']:.3f})"
                if "max_gap" in v
                else ""
            )
            for s, v in r["acceptance_by_slot"].items()
        )
        x_none = f"{r['x_none']:6.2f}" if r.get("x_none") is not None else "     -"
        print(
            f"{r['clients']:7}  {r['server']:13} {r['np']:4}  {r['setting']:7} {r['ok']:3}/{r['requests']:<3} "
            f"{r['mismatches']:8}  {r['overall_tps']:9.1f}  {ratio:7.2f}  {x_none}  "
            f"{r['ttft_p50']:6.2f}/{r['ttft_p95']:6.2f}  {acc}"
        )
