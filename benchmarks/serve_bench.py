"""Concurrent streaming clients against `mtp-cli serve` on loopback, per draft setting.

    python benchmarks/serve_bench.py [-m MODEL] [--clients 32] [--requests 4] [--max-tokens 48]
                                     [--settings none,3,auto] [-t 2] [--timeout 900] [--json out.json]
    python benchmarks/serve_bench.py --slots 1,2,4,8 [--settings none,auto] [--llama-server]
                                     [--llama-settings none,none+nofa] [--preamble 300] ...

With --slots, for each count C: C clients at once against `mtp-cli serve -np 1` and `-np C` (and
llama.cpp's own `llama-server -np 1` and `-np C`, built from the pinned sdist's vendored sources,
with --llama-server), same file, prompts, context and threads: aggregate tok/s, time to first token
p50/p95, and for ours the acceptance by draft position pooled per slot (a forced N: `--settings 3`).

For each setting a server is started (`mtp-cli serve`, its own process), and `--clients` threads
each send `--requests` streaming chat requests (greedy, prompts taken in turn from the built-in
evaluation prompts) over raw HTTP, all at once. Every stream is checked: each line `data: {json}`,
one finish_reason, `[DONE]` last, usage on the last chunk, and the text equal to plain greedy
decoding's for its prompt (computed first through the library, as `generate --chat` does, with the
flash attention the server runs: the two kernels part at near-ties, ARCHITECTURE §3). Reported
per setting: errors, truncated or garbled streams, mismatches; time to first token, request latency
(p50 / p95, queueing included: one model serves one request at a time), tokens/s per request (after
its first token) and overall (all tokens / wall time), acceptance; and overall tok/s as a ratio to
`none` measured in the same run. Without -m: the demo model. A setting may end in `+fa` or `+nofa`
(flash attention on / off; `--llama-settings none,none+nofa` runs llama-server both ways): by default
llama-server turns it on and mtp-cli, on a CPU, off for -np 1 and as the CPU measures for more
(mtp_cli.attention_probe).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_ENTRY = "import sys; sys.argv[0] = 'mtp-cli'; from mtp_cli.__main__ import main; main()"


@dataclass
class Outcome:
    ok: bool = False
    error: Optional[str] = None  # HTTP or connection failure
    garbled: Optional[str] = None  # a malformed or truncated stream
    mismatch: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    tokens: int = 0
    tps: float = 0.0
    acceptance: Optional[float] = None
    slot: Optional[int] = None
    prompt: int = -1  # its prompt's index
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)


@dataclass
class SettingResult:
    setting: str
    requests: int
    ok: int
    errors: int
    garbled: int
    mismatches: int
    wall_s: float
    ttft_p50: float
    ttft_p95: float
    latency_p50: float
    latency_p95: float
    request_tps_median: float
    overall_tps: float
    acceptance_mean: Optional[float]
    ratio_vs_none: Optional[float] = None
    first_problems: list[str] = field(default_factory=list)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def references(model: str, prompts: list[str], max_tokens: int, n_threads: int) -> dict[bool, list[str]]:
    """Plain greedy decoding's text for each prompt, through the chat template (generate --chat),
    with flash attention on (True) and off: a server's texts are compared with its own setting's."""
    from mtp_cli.chat import chat_prompt
    from mtp_cli.config import GenConfig
    from mtp_cli.runtime import Runtime

    out: dict[bool, list[str]] = {True: [], False: []}
    with Runtime.load(model) as rt:
        for on, texts in out.items():
            cfg = GenConfig(n_predict=max_tokens, temp=0.0, n_threads=n_threads, n_ctx=4096, flash_attn=on)
            for p in prompts:
                text = chat_prompt(rt.file, p, *rt.special_texts())
                texts.append("".join(ev.text for ev in rt.generate(rt.tokenize(text, parse_special=True), cfg)))
    return out


def attention_of(model: str, setting: str, n_threads: int, n_parallel: int, llama: bool) -> bool:
    """Whether a server runs with flash attention: +fa / +nofa; llama-server's auto turns it on;
    mtp-cli's as its contexts resolve it (off for one slot on a CPU, the CPU's measured verdict for
    several, llama.cpp's auto, on, where layers are offloaded)."""
    attn = setting.partition("+")[2]
    if attn or llama:
        return attn == "fa" or not attn
    from gguf_tools.gguf_file import open_gguf
    from mtp_cli.attention_probe import AttentionShape
    from mtp_cli.config import GenConfig, LoadConfig
    from mtp_cli.contexts import fa_auto_off, flash_attn_for

    gf = open_gguf(model)
    off = fa_auto_off(LoadConfig(n_parallel=n_parallel), gf.arch)
    on = flash_attn_for(GenConfig(n_threads=n_threads), off, n_parallel, AttentionShape.of(gf))
    return on is not False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: str, setting: str, port: int, n_threads: int, n_parallel: int = 1, llama: Optional[Path] = None
) -> subprocess.Popen:
    """`mtp-cli serve` with a draft setting (none, a number, auto; the model's default drafting), or
    llama.cpp's llama-server (`llama`: its binary; plain decoding), both on a 4096-token context
    split among `n_parallel` slots; a setting may end in +fa or +nofa (flash attention on / off; each
    server's own default otherwise: llama-server's auto turns it on, mtp-cli's attention_of says)."""
    setting, _, attn = setting.partition("+")  # (+fa / +nofa: flash attention on / off, either server)
    common = ["-m", model, "--port", str(port), "-t", str(n_threads), "-c", "4096", "-np", str(n_parallel)]
    common += {"fa": ["-fa", "on"], "nofa": ["-fa", "off"], "": []}[attn]
    if llama is not None:
        cmd = [str(llama), *common, "-tb", str(n_threads), "--host", "127.0.0.1"]
    else:
        spec = {"none": ["--spec-type", "none"], "auto": []}.get(setting, ["--spec-draft-n-max", setting])
        cmd = [sys.executable, "-c", _ENTRY, "serve", *common, *spec]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("serve did not come up in 120 s")


@dataclass
class Read:
    """What one SSE stream said."""

    text: list[str] = field(default_factory=list)
    finishes: int = 0
    done: bool = False
    usage: Optional[dict] = None
    mtp: dict = field(default_factory=dict)  # (llama-server's responses have none)
    t_first: Optional[float] = None


def read_stream(r: Any, o: Outcome) -> Optional[Read]:
    """The stream's chunks, checked line by line (None, with o.error or o.garbled said, if bad)."""
    got = Read()
    for raw in r:
        line = raw.decode("utf-8").rstrip("\n")
        if not line:
            continue
        if not line.startswith("data: "):
            o.garbled = f"not an SSE data line: {line[:80]!r}"
            return None
        data = line[6:]
        if data == "[DONE]":
            got.done = True
            continue
        if got.done:
            o.garbled = "data after [DONE]"
            return None
        chunk = json.loads(data)
        if "error" in chunk:
            o.error = f"error in stream: {chunk['error']}"
            return None
        got.usage = chunk.get("usage") or got.usage
        got.mtp = chunk.get("mtp") or got.mtp
        if not chunk.get("choices"):
            continue
        ch = chunk["choices"][0]
        piece = ch["delta"].get("content")
        if piece:
            got.text.append(piece)
            if got.t_first is None:
                got.t_first = time.perf_counter()
        got.finishes += ch["finish_reason"] is not None
    return got


def one_request(port: int, prompt: str, want: str, max_tokens: int, timeout: float) -> Outcome:
    """One streaming chat request, its stream checked line by line."""
    o = Outcome()
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},  # (llama-server sends usage only when asked)
    }
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            o.error = f"HTTP {r.status}: {r.read()[:200]!r}"
            return o
        got = read_stream(r, o)
        c.close()
    except (OSError, ValueError, KeyError, IndexError) as e:
        o.error = f"{type(e).__name__}: {e}"
        return o
    t_end = time.perf_counter()
    if got is None:
        return o
    if not got.done or got.finishes != 1 or got.usage is None:
        o.garbled = f"truncated: [DONE] {got.done}, {got.finishes} finish chunks, usage {got.usage is not None}"
        return o
    o.ok, o.latency, t_first, mtp = True, t_end - t0, got.t_first, got.mtp
    o.ttft = (t_first or t_end) - t0
    o.tokens = int(got.usage["completion_tokens"])
    o.tps = (o.tokens - 1) / (t_end - t_first) if t_first and t_end > t_first and o.tokens > 1 else 0.0
    o.acceptance = mtp.get("acceptance") if mtp.get("spec_type", "none") != "none" else None
    o.slot = mtp.get("slot")
    o.drafted_by_pos, o.accepted_by_pos = mtp.get("drafted_by_pos", []), mtp.get("accepted_by_pos", [])
    o.mismatch = "".join(got.text) != want
    return o


def run_setting(
    model: str,
    setting: str,
    prompts: list[str],
    all_refs: dict[bool, list[str]],
    args: argparse.Namespace,
    n_parallel: int = 1,
    llama: Optional[Path] = None,
) -> tuple[SettingResult, list[Outcome]]:
    refs = all_refs[attention_of(model, setting, args.threads, n_parallel, llama is not None)]
    port = free_port()
    proc = start_server(model, setting, port, args.threads, n_parallel, llama)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    deadline = time.monotonic() + args.timeout

    def client(k: int) -> None:
        for j in range(args.requests):
            if time.monotonic() > deadline:
                return
            i = (k * args.requests + j) % len(prompts)
            o = one_request(port, prompts[i], refs[i], args.max_tokens, max(1.0, deadline - time.monotonic()))
            o.prompt = i
            with lock:
                outcomes.append(o)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    ok = [o for o in outcomes if o.ok]
    acc = [o.acceptance for o in ok if o.acceptance is not None]
    problems = [o.error or o.garbled or "" for o in outcomes if o.error or o.garbled]
    res = SettingResult(
        setting=setting,
        requests=len(outcomes),
        ok=len(ok),
        errors=sum(o.error is not None for o in outcomes),
        garbled=sum(o.garbled is not None for o in outcomes),
        mismatches=sum(o.mismatch for o in ok),
        wall_s=wall,
        ttft_p50=pct([o.ttft for o in ok], 0.5),
        ttft_p95=pct([o.ttft for o in ok], 0.95),
        latency_p50=pct([o.latency for o in ok], 0.5),
        latency_p95=pct([o.latency for o in ok], 0.95),
        request_tps_median=statistics.median([o.tps for o in ok]) if ok else 0.0,
        overall_tps=sum(o.tokens for o in ok) / wall if wall else 0.0,
        acceptance_mean=statistics.mean(acc) if acc else None,
        first_problems=problems[:3],
    )
    return res, outcomes


def with_preamble(prompts: list[str], words: int) -> list[str]:
    """One document of `words` words before every question (a long shared prefix, as RAG or a system
    prompt puts one); the prompts as they are for 0."""
    if not words:
        return prompts
    from mtp_cli.prompts import read_prompts

    text = " ".join(read_prompts(ROOT / "mtp_cli" / "train" / "prompts" / "eval_prompts.txt")).split()
    doc = " ".join(text[:words])
    return [f"Some requests people sent me:\n{doc}\n\nNow mine: {p}" for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--settings", default="none,3,auto")
    ap.add_argument("-t", "--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per setting, all clients together")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--slots", default=None, help="client counts C: -np 1 against -np C at C clients each")
    ap.add_argument("--preamble", type=int, default=0, help="words of a document before every prompt (one for all)")
    ap.add_argument("--llama-server", action="store_true", help="with --slots: llama.cpp's llama-server too")
    ap.add_argument(
        "--llama-settings", default="none", help="llama-server's settings, comma-separated: none, none+nofa (-fa off)"
    )
    ap.add_argument("--repeats", type=int, default=1, help="with --slots: runs of each server, in turn (medians)")
    args = ap.parse_args()
    if not 1 <= args.clients <= 256 or not 1 <= args.requests <= 100:
        raise SystemExit("--clients must be 1..256 and --requests 1..100")
    from mtp_cli.speed.runs import PROMPTS

    model = args.model
    if model is None:
        from mtp_cli.demo import demo_model

        model = str(demo_model())
    prompts = with_preamble(list(PROMPTS), args.preamble)
    print(f"model {model}; {args.clients} clients x {args.requests} streaming requests, {args.max_tokens} tokens")
    refs = references(model, prompts, args.max_tokens, args.threads)
    if args.slots:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from serve_slots import sweep

        return sweep(model, prompts, refs, args, run_setting)
    results = []
    for s in args.settings.split(","):
        res, _ = run_setting(model, s.strip(), prompts, refs, args)
        results.append(res)
        print(f"  {s}: {res.ok}/{res.requests} ok in {res.wall_s:.1f} s", flush=True)
    base = next((r.overall_tps for r in results if r.setting == "none"), None)
    for r in results:
        r.ratio_vs_none = r.overall_tps / base if base else None
    print(
        "setting  ok/req  err garbled mismatch  ttft p50/p95 s  latency p50/p95 s  req tok/s  all tok/s  x none  accept"
    )
    for r in results:
        acc = f"{r.acceptance_mean:.2f}" if r.acceptance_mean is not None else "-"
        ratio = f"{r.ratio_vs_none:.2f}" if r.ratio_vs_none is not None else "-"
        print(
            f"{r.setting:8} {r.ok:3}/{r.requests:<3} {r.errors:4} {r.garbled:7} {r.mismatches:8}  "
            f"{r.ttft_p50:6.2f}/{r.ttft_p95:6.2f}  {r.latency_p50:8.2f}/{r.latency_p95:7.2f}  "
            f"{r.request_tps_median:9.1f}  {r.overall_tps:9.1f}  {ratio:>6}  {acc:>6}"
        )
        for p in r.first_problems:
            print(f"    {p}")
    if args.json:
        doc: dict[str, Any] = {"model": model, "args": {k: str(v) for k, v in vars(args).items()}}
        doc["results"] = [asdict(r) for r in results]
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
