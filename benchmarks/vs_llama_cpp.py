"""mtp-cli against llama.cpp's own C++ loops on the same file and prompts: plain decoding, MTP, and
the head chained after a text lookup.

    python benchmarks/vs_llama_cpp.py [-m MODEL] [--prompts N] [-n 128] [--repeats 3] [-t 1]
                                      [--chain] [--edit] [--json out.json]

llama.cpp's `llama-completion` (plain) and `llama-speculative-simple` (`--spec-type draft-mtp
--spec-draft-n-max N`) are built once from the vendored sources of the pinned llama-cpp-python
(its sdist, with the same compiler fix scripts/llama_build.py applies) into the user cache. Both
sides get the same chat-rendered prompts (each tokenizes the text itself), greedy, the same threads;
mtp-cli runs in this process through the library. Interleaved repeats, medians; per N: tok/s,
ours/theirs, acceptance, tokens per pass, per-position acceptance (llama.cpp's from its per-step
debug lines), and on how many prompts each side's drafted greedy text is its plain decoding's (the
plain texts of the two sides compared too). Not run in CI.

--chain adds `--spec-type ngram-mod` (the text lookup alone) and `draft-mtp,ngram-mod` at each N on
both sides, each with its own defaults for the lookup: llama.cpp's ngram-mod drafts 48-64 tokens or
nothing; ours (`ngram-mod` is our `lookup`) drafts what pays, up to `auto`'s cap, the head at N.
--edit takes the edit benchmark's prompts (benchmarks/edit_prompts.json: copy, fix, rename, ...),
where lookups draft, instead of the held-out chat prompts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PIN = "llama-cpp-python==0.3.36"
TARGETS = ("llama-completion", "llama-speculative-simple")
EVAL = ROOT / "mtp_cli" / "train" / "prompts" / "eval_prompts.txt"
EDIT = ROOT / "benchmarks" / "edit_prompts.json"
CHAIN = "draft-mtp,ngram-mod"  # llama.cpp's spelling, which both sides take
LOOKUP = "ngram-mod"


def _llama_build():
    spec = importlib.util.spec_from_file_location("llama_build", ROOT / "scripts" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["llama_build"] = mod
    spec.loader.exec_module(mod)
    return mod


def binaries(cache: Path) -> Path:
    """The folder of llama.cpp's tools, built once from the pinned sdist's vendored tree."""
    return _llama_build().build_tools(TARGETS, cache)


def theirs(
    bins: Path, model: Path, prompt: str, n: int, n_max: int, threads: int, fa: str = "on", spec: str = "draft-mtp"
) -> dict:
    """One llama.cpp run: what it printed, tok/s, and for MTP (`spec`: a spec type or a chain) the
    per-step (accepted, drafted). The prompt goes as -p: -f drops a file's final newline (and a chat
    prompt ends with one)."""
    common = [
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n),
        "--temp",
        "0",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-c",
        "2048",
        "--seed",
        "0",
        "-fa",
        fa,
    ]
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    if spec == "none":
        cmd = [str(bins / "llama-completion"), *common, "-no-cnv", "--no-display-prompt"]
        r = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", env=env, timeout=600)
        # its perf lines time the decodes ("eval") and the sampler apart; ours is the loop's wall time,
        # so both are added (its first token is the prompt pass's, as ours)
        m = re.search(r"\n[^\n]*?\beval time =\s*([\d.]+) ms /\s*(\d+) runs", r.stderr)
        smp = re.search(r"sampling time =\s*([\d.]+) ms", r.stderr)
        if r.returncode != 0 or not m or not smp:
            raise SystemExit(f"llama-completion failed: {r.stderr[-600:]}")
        ms = float(m.group(1)) + float(smp.group(1))
        return {"text": r.stdout, "tps": int(m.group(2)) / ms * 1000.0, "steps": []}
    cmd = [
        str(bins / "llama-speculative-simple"),
        *common,
        "--spec-type",
        spec,
        *(["--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0"] if n_max else []),
        "-v",
    ]
    # (-v prints each token's piece: a UTF-8 character split across pieces is not valid alone)
    r = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", env=env, timeout=600)
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"llama-speculative-simple failed: {r.stderr[-600:]}")
    steps = [(int(a), int(k)) for a, k in re.findall(r"accepted (\d+)/(\d+) draft tokens", r.stderr)]
    return {"text": r.stdout, "tps": float(m.group(3)), "steps": steps}


def by_position(steps: list[tuple[int, int]], n_max: int) -> list[float]:
    """Acceptance at draft position i (accepted / drafted there) from per-step (accepted, drafted)."""
    out = []
    for i in range(1, n_max + 1):
        drafted = sum(1 for _, k in steps if k >= i)
        out.append(sum(1 for a, k in steps if k >= i and a >= i) / drafted if drafted else 0.0)
    return out


Row = tuple[str, int]  # (spec type: "none", "draft-mtp", LOOKUP or CHAIN; the head's N, 0 without one)


def ours_config(a: argparse.Namespace, spec: str, n: int):
    """Our settings for a row, as tune's candidate of that spec and N runs them: the head at N, a
    lookup up to `auto`'s cap beside it (a fixed policy sizes the head)."""
    from mtp_cli.config import GenConfig
    from mtp_cli.speed.candidates import Candidate

    c = Candidate(spec, spec, n)
    base = GenConfig(n_predict=a.n, temp=0.0, n_threads=a.threads, n_ctx=2048, flash_attn=a.flash_attn == "on")
    return c.config(base), c.policy()


def measure(a: argparse.Namespace, model: Path, bins: Path, texts: list[str], rows_: list[Row]) -> dict:
    """Ours (the library, this process) and theirs (a process each), interleaved: tok/s, texts, stats."""
    from mtp_cli import chat
    from mtp_cli.runtime import Runtime

    keys = ("ours", "theirs", "text_o", "text_t", "st_o", "st_t")
    rows: dict[Row, dict[str, list]] = {x: {k: [] for k in keys} for x in rows_}
    with Runtime.load(model, spec_type="mtp") as rt:
        bos, eos = rt.special_texts()
        rendered = [chat.chat_prompt(rt.file, t, bos, eos) for t in texts]
        toks = [rt.tokenize(t, add_special=True, parse_special=True) for t in rendered]
        for r in range(a.repeats):
            for x in rows_ if r % 2 == 0 else list(reversed(rows_)):
                spec, n = x
                cfg, policy = ours_config(a, spec, n)
                for text, tk in zip(rendered, toks):
                    ours_text = "".join(ev.text for ev in rt.generate(tk, cfg, policy=policy))
                    st = rt.stats
                    t = theirs(bins, model, text, a.n, n, a.threads, a.flash_attn, spec)
                    rows[x]["ours"].append(st.tokens_per_second)
                    rows[x]["theirs"].append(t["tps"])
                    if r == 0:
                        rows[x]["text_o"].append(ours_text)
                        rows[x]["text_t"].append(t["text"])
                        rows[x]["st_o"].append(st)
                        rows[x]["st_t"].extend(t["steps"])
    return rows


def plain_text(completion: str) -> str:
    """What llama-completion generated: its stdout less the end-of-generation line and the blank lines
    it adds (where -n stops it, llama-speculative-simple's text goes on: a token more)."""
    return completion.split(" [end of text]")[0].rstrip("\n")


def row(x: Row, r: dict, plain: dict) -> dict:
    """One row's medians, ratio, acceptance (pooled over the first repeat's prompts), and the prompts
    whose text is each side's own plain decoding's (`plain`: the plain row's; llama.cpp prints the
    prompt before its drafted text; for the plain row itself, ours against theirs)."""
    from mtp_cli.stats import GenStats

    spec, n = x
    o, t = statistics.median(r["ours"]), statistics.median(r["theirs"])
    ours_plain, theirs_plain = plain["text_o"], [plain_text(b) for b in plain["text_t"]]
    out = {
        "spec": spec,
        "n": n,
        "ours": o,
        "theirs": t,
        "exact_ours": sum(a == p for a, p in zip(r["text_o"], ours_plain)),
        "exact_theirs": sum(p in b for b, p in zip(r["text_t"], ours_plain if spec == "none" else theirs_plain)),
        "prompts": len(ours_plain),
    }
    if spec != "none":
        pooled, steps = GenStats.pooled(r["st_o"]), r["st_t"]
        out |= {
            "acceptance": pooled.acceptance,
            "acceptance_theirs": sum(x for x, _ in steps) / max(1, sum(k for _, k in steps)),
            "tokens_per_pass": pooled.tokens_per_pass,
            "by_pos": pooled.acceptance_by_pos[: max(n, 1)],  # (a lookup drafts further: the head's N)
            "by_pos_theirs": by_position(steps, max(n, 1)),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, help="GGUF with an MTP head [default: the demo model]")
    ap.add_argument("--prompts", type=int, default=6, help="held-out chat prompts used (of eval_prompts.txt)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--ns", default="1,2,3,4")
    ap.add_argument("--chain", action="store_true", help=f"also `{LOOKUP}` and `{CHAIN}` at each N, both sides")
    ap.add_argument("--edit", action="store_true", help="the edit benchmark's prompts instead of held-out chat")
    ap.add_argument(
        "--flash-attn", choices=("on", "off"), default="on", help="both sides (on: llama.cpp's default on a CPU)"
    )
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from mtp_cli.demo import demo_model
    from mtp_cli.prompts import read_prompts
    from mtp_cli.user_cache import cache_dir

    model = a.model or demo_model()
    ns = [int(x) for x in a.ns.split(",")]
    if min(ns) < 1:
        raise SystemExit(f"--ns: the head's N must be 1 or more, got {a.ns!r} (plain decoding is always measured)")
    specs = ["draft-mtp", CHAIN] if a.chain else ["draft-mtp"]
    rows_: list[Row] = [("none", 0)] + [(s, n) for s in specs for n in ns]
    if a.chain:
        rows_.insert(1, (LOOKUP, 0))
    if a.edit:
        texts = [p["prompt"] for p in json.loads(EDIT.read_text())["prompts"]][: a.prompts]
    else:
        texts = read_prompts(EVAL)[: a.prompts]
    rows = measure(a, model, binaries(cache_dir()), texts, rows_)
    what = "edit" if a.edit else "held-out chat"
    print(f"{model.name}; {len(texts)} {what} prompts, {a.n} tokens, greedy, -t {a.threads}, "
          f"{a.repeats} interleaved repeats (medians)")  # fmt: skip
    print(f"{'':10} {'ours t/s':>9} {'theirs':>9} {'ratio':>6}  {'acc ours':>8} {'theirs':>7}  {'tok/pass':>8}  "
          "by position (ours | theirs)  plain's text (ours | theirs)")  # fmt: skip
    result = [row(x, rows[x], rows[("none", 0)]) for x in rows_]
    for x in result:
        kind = "chain" if x["spec"] == CHAIN else "mtp"
        label = {"none": "plain", LOOKUP: "lookup"}.get(x["spec"], f"{kind} N={x['n']}")
        same = f"{x['exact_ours']}/{x['prompts']} | {x['exact_theirs']}/{x['prompts']}"
        if x["spec"] == "none":
            print(f"{label:10} {x['ours']:9.1f} {x['theirs']:9.1f} {x['ours'] / x['theirs']:6.3f}  {'':55}{same}")
            continue
        pos = " ".join(f"{p:.2f}" for p in x["by_pos"]) + " | " + " ".join(f"{p:.2f}" for p in x["by_pos_theirs"])
        acc = f"{x['acceptance']:8.3f} {x['acceptance_theirs']:7.3f}  {x['tokens_per_pass']:8.2f}"
        print(f"{label:10} {x['ours']:9.1f} {x['theirs']:9.1f} {x['ours'] / x['theirs']:6.3f}  {acc}  {pos:28} {same}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
