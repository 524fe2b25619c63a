"""MTP over llama.cpp RPC: the weights on loopback `ggml-rpc-server`s behind a proxy (a process of its
own) that delays every packet (0, 1, 5 ms each way), one or two servers, the model's own head remote (with the trunk) or
local (-ngld 0: loaded as a sidecar of its own on this machine), against plain decoding, in one run.

    python benchmarks/rpc_bench.py [-m MODEL.gguf] [--delays 0 1 5] [--servers 1 2] [-N 1 2 3]
                                   [-n 32] [--repeats 5] [--prompts 2] [--tune-budget 60] [--heads local]

Default model: the demo (SmolLM2-135M-Instruct adopted, with its trained head). The servers are built
from the pinned sdist's vendored llama.cpp (once, cached). Every proxy is registered once (ggml keeps
RPC devices for the process's life); each row first runs `tune` on that row's devices (-dev) and
placement (its profile saved in a scratch config directory, keyed by them as `--rpc` would key it),
then loads the model there and runs none, mtp at each N, auto (what `--draft auto` resolves to with
that profile) and adaptive (no profile: one controller learning across the row's generations, as a
`serve` or `-cnv` session keeps it) interleaved repeat by repeat (medians), and prints tokens/s and
the ratio to plain decoding in the same row, and adaptive over auto pair by pair (each repeat's two
runs close in time: the machine's drift falls on both), beside plain decoding run twice, paired the
same way (what this machine's noise alone makes of two identical settings). "in step" is the MTP
drafter kept in step but never asked to draft: the target computes its h rows every token, over
RPC one more round trip (what an asleep drafter does not pay: its target computes none). Writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.config import GenConfig, LoadConfig, Placement  # noqa: E402
from mtp_cli.llama_ext.rpc import hello  # noqa: E402
from mtp_cli.policy import DraftPolicy  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from mtp_cli.session import Session  # noqa: E402
from mtp_cli.speed.adaptive import ADAPTIVE_N_MAX, AdaptiveController  # noqa: E402
from mtp_cli.speed.auto import AutoDraft  # noqa: E402
from mtp_cli.speed.runs import PROMPTS, Setting, interleaved, setting_name  # noqa: E402
from mtp_cli.speed.tune import tune  # noqa: E402
from mtp_cli.user_cache import cache_dir  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(binary: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_server(port, "an rpc-server")
    return proc, port


def wait_for_server(port: int, what: str) -> None:
    """Until an rpc-server answers ggml's handshake at 127.0.0.1:port (30 s)."""
    for _ in range(150):
        try:
            hello(f"127.0.0.1:{port}", timeout=1)
            return
        except lx.LlamaError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not start")


class DelayProxy:
    """127.0.0.1:port -> target, every chunk held `delay_ms` in each direction (order kept)."""

    def __init__(self, target: int, delay_ms: float, port: int):
        self.target, self.delay, self.port = target, delay_ms / 1000, port
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_until_complete(server.serve_forever())

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(self._pipe(r, tw), self._pipe(tr, w))

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        q: asyncio.Queue = asyncio.Queue()

        async def rx() -> None:
            while data := await r.read(1 << 16):
                await q.put((self.loop.time() + self.delay, data))
            await q.put(None)

        async def tx() -> None:
            while (item := await q.get()) is not None:
                wait = item[0] - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                w.write(item[1])
                await w.drain()
            w.close()

        await asyncio.gather(rx(), tx())


def start_proxies(specs: list[tuple[int, int, float]]) -> subprocess.Popen:
    """DelayProxies (listen port, server port, delay ms) in a process of their own: in this one they
    would wait for the GIL while the loop runs Python, a delay no network adds."""
    proc = subprocess.Popen([sys.executable, __file__, "--proxies", json.dumps(specs)])
    for port, _, _ in specs:
        wait_for_server(port, "a delay proxy")  # (through it, to its server)
    return proc


def serve_proxies(specs: str) -> None:
    for port, target, delay in json.loads(specs):
        DelayProxy(target, delay, port)
    threading.Event().wait()


class NeverDraft(DraftPolicy):
    """The drafter loaded and in step, never asked to draft: what MTP costs before it drafts at all."""

    def step(self, drafted: int, accepted: int, t_consumer: float, done: int) -> int:
        return 0


def run_row(model: Path, devices: list[str], head_local: bool, prompts: list[str], args: argparse.Namespace) -> dict:
    placement = Placement(device=tuple(devices), n_gpu_layers_draft=0 if head_local else None)
    base = GenConfig(temp=0.0, n_predict=args.n_predict, n_threads=1, n_ctx=1024)
    with tempfile.TemporaryDirectory() as profiles_dir:
        tuned = tune(
            model,
            LoadConfig(n_gpu_layers=99, placement=placement),
            n_threads=1,
            budget=args.tune_budget,
            config_dir=Path(profiles_dir),
        )
        with Runtime.load(model, spec_type="mtp", n_gpu_layers=99, placement=placement) as rt:
            s = Session(rt)
            toks = [s.chat([{"role": "user", "content": p}]).tokens for p in prompts]
            mtp = replace(base, spec_type="mtp")
            auto = AutoDraft(rt, Path(profiles_dir)).resolve(replace(mtp, draft_mode="auto"))
            assert auto.mode == "profile", "tune's profile was not found under this row's key"
            ctl = AdaptiveController(ADAPTIVE_N_MAX)
            settings = [Setting("none", base), Setting("none again", base)]  # (the row's noise: the same, paired)
            settings += [Setting(setting_name("mtp", n), replace(mtp, draft_n_max=n)) for n in args.n_values]
            settings.append(Setting("auto", auto.config))
            settings.append(
                Setting("adaptive", replace(mtp, draft_mode="adaptive", draft_n_max=ctl.n_max), lambda: ctl)
            )
            settings.append(Setting("in step", replace(mtp, draft_n_max=1), lambda: NeverDraft(1)))
            res = interleaved(rt, toks, settings, args.repeats)
    none = res["none"].stats.tokens_per_second
    out = {k: {"tps": r.stats.tokens_per_second, "ratio": r.stats.tokens_per_second / none} for k, r in res.items()}
    out["auto"]["tuned"] = tuned.best.name if tuned.best else None
    out["adaptive"]["now"] = ctl.describe()
    out["adaptive"]["runs"] = [round(x / none, 3) for x in res["adaptive"].runs]  # (learning, repeat by repeat)
    out["adaptive"]["changes"] = ctl.changes
    # (adaptive over tune's pick, repeat by repeat: each pair ran in the same repeat, close in time, so
    # shares more of the machine's state; identical configurations' medians differed by up to 14% in a row)
    pairs = [a / b for a, b in zip(res["adaptive"].runs, res["auto"].runs) if b]
    out["adaptive"]["over_auto_pairs"] = [round(x, 3) for x in pairs]
    out["adaptive"]["over_auto"] = round(statistics.median(pairs), 3) if pairs else None
    same = [a / b for a, b in zip(res["none again"].runs, res["none"].runs) if b]
    out["none again"]["over_none_pairs"] = [round(x, 3) for x in same]
    out["none again"]["over_none"] = round(statistics.median(same), 3) if same else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None)
    ap.add_argument("--delays", type=float, nargs="+", default=[0, 1, 5])
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-N", "--n-values", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--heads", nargs="+", choices=["remote", "local"], default=["remote", "local"])
    ap.add_argument("--tune-budget", type=float, default=60.0, help="seconds of `tune` per row (its default)")
    ap.add_argument("--json", type=Path, default=Path("rpc_bench.json"))
    ap.add_argument("--proxies", help=argparse.SUPPRESS)  # (the proxies' own process)
    args = ap.parse_args()
    if args.proxies:
        return serve_proxies(args.proxies)
    lx.quiet_logs()
    import llama_build

    if args.model is None:
        from mtp_cli.cli.demo_model import demo_file

        args.model = demo_file()
    binary = llama_build.build_tools(("ggml-rpc-server",), cache_dir()) / "ggml-rpc-server"
    servers = [start_server(binary) for _ in range(max(args.servers))]
    try:
        names: dict[tuple[float, int], str] = {}
        specs = []
        for d in args.delays:
            for i, (_, port) in enumerate(servers):
                specs.append((free_port(), port, d))
                names[d, i] = f"RPC{len(names)}"  # (ggml names RPC devices in registration order)
        servers.append((start_proxies(specs), 0))
        lx.add_rpc_servers([f"127.0.0.1:{p}" for p, _, _ in specs])
        rows = []
        for n_servers in args.servers:
            for d in args.delays:
                for head_local in [h == "local" for h in args.heads]:
                    devs = [names[d, i] for i in range(n_servers)]
                    r = run_row(args.model, devs, head_local, PROMPTS[: args.prompts], args)
                    rows.append({"servers": n_servers, "delay_ms": d, "head": "local" if head_local else "remote", **r})
                    cells = "  ".join(f"{k} {v['tps']:6.1f} ({v['ratio']:.2f}x)" for k, v in r.items())
                    print(f"{n_servers} server(s), +{d:g} ms, head {rows[-1]['head']:6}: {cells}", flush=True)
                    print(f"    tune chose {r['auto']['tuned']}; {r['adaptive']['now']}", flush=True)
                    ad = r["adaptive"]
                    print(f"    adaptive by repeat {ad['runs']} (x plain's median); best N changes {ad['changes']}")
                    print(f"    adaptive / auto pair by pair {ad['over_auto_pairs']}: median {ad['over_auto']}")
                    na = r["none again"]
                    print(f"    none again / none, pair by pair {na['over_none_pairs']}: median {na['over_none']}")
    finally:
        for proc, _ in servers:
            proc.terminate()
    args.json.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
