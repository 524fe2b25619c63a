"""Decode-time acceptance of an MTP head: greedy decoding through the runtime, chat template applied,
under the row edits people run with (penalties, banned tokens), through the library and through
`serve`.

    python benchmarks/accept_bench.py [-m MODEL.gguf] [-md SIDECAR] [--prompts FILE] [-N 3] [-n 128] [-t 2]
                                      [--settings plain,repeat,freq-presence,ban] [--ban TEXT ...]
                                      [--serve] [--json out.json]

Without -m: the demo model. Default prompts: the held-out evaluation prompts
(mtp_cli/train/prompts/eval_prompts.txt: written apart from the training prompts, never trained on).
Each setting runs every prompt; `--serve` runs them again as chat requests to a `serve` on loopback
(the server without penalties of its own; each request sends the setting's `repeat_penalty`,
`frequency_penalty`, `presence_penalty` and `logit_bias`), pooling the `mtp` object's counts.
Printed per setting and route: acceptance by draft position (accepted where drafted), mean accepted
drafts and tokens per verify pass, and each position's difference to the `plain` setting's; JSON
is written too. `--explain` (library route) splits the first draft position in two: where the
setting's edits changed the target's choice (its unedited argmax is not what it chose) and where
they did not, with the acceptance at each, and where changed and missed, how far down the head's
edited row the target's choice was (its rank: 1 = the head's second choice).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtp_cli import llama_ext as lx  # noqa: E402
from mtp_cli.config import GenConfig, LoadConfig  # noqa: E402
from mtp_cli.prompts import read_prompts  # noqa: E402
from mtp_cli.train.data import PROMPTS_DIR  # noqa: E402
from mtp_cli.train.pipeline import measure_acceptance  # noqa: E402

EVAL_PROMPTS = PROMPTS_DIR / "eval_prompts.txt"
N_CTX = 1024
# the settings: GenConfig's row-edit fields (`ban`'s logit_bias is filled in from --ban per model)
SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "repeat": {"repeat_penalty": 1.1},  # the demo's own, Ollama's default
    "freq-presence": {"frequency_penalty": 0.5, "presence_penalty": 0.5},
    "ban": {},  # logit_bias -inf on the --ban texts' tokens
}
BAN = (".",)  # the full stop: an answer cannot write around it, so the ban moves many of its tokens


def banned(model: Path, texts: list[str]) -> tuple[tuple[int, float], ...]:
    """A -inf bias on every token of each text (tokenized alone, no BOS)."""
    from mtp_cli.runtime import Runtime

    with Runtime.load(model) as rt:
        ids = sorted({t for text in texts for t in rt.tokenize(text, add_special=False)})
    return tuple((t, float("-inf")) for t in ids)


def pooled(drafted: list[int], accepted: list[int], n_tokens: int, n_verify: int) -> dict[str, Any]:
    by_pos = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
    return {
        "drafted_by_pos": drafted,
        "accepted_by_pos": accepted,
        "acceptance_by_pos": by_pos,
        "tokens": n_tokens,
        "verify_passes": n_verify,
        "mean_accepted_per_pass": sum(accepted) / n_verify if n_verify else 0.0,
        "tokens_per_pass": n_tokens / n_verify if n_verify else 0.0,
    }


class Explain:
    """Counts, at each verify pass with a draft, whether the edits changed the target's choice at its
    first row (the first draft's position) and whether that draft was kept (wraps Chooser.verify);
    where they changed it and the draft was not kept, the rank of the target's choice in the head's
    edited row (wraps DraftSteer.pick: its first row of the step): 1 = the head's second choice. A
    head whose logits ranked the alternatives as the target's do would follow the edits; ranks far
    down say the head does not know the runners-up, which no edit of its row can mend."""

    RANKS = ("1", "2", "3-4", "5+")

    def __init__(self) -> None:
        self.counts = {"changed": [0, 0], "unchanged": [0, 0]}  # [drafted, kept]
        self.ranks = dict.fromkeys(self.RANKS, 0)
        self._row: Any = None  # the head's first edited row of this step

    def __enter__(self) -> Explain:
        from mtp_cli import sampling

        real = self.real = sampling.Chooser.verify
        real_pick = self.real_pick = sampling.DraftSteer.pick

        def pick(steer, row, p_min, probe):
            tok = real_pick(steer, row, p_min, probe)
            if self._row is None:
                self._row = row.copy()  # (edited in place by the pick)
            return tok

        def verify(chooser, ctx, rows, drafts, history, row0=0):
            unedited = int(rows[0].argmax())
            a, nxt = real(chooser, ctx, rows, drafts, history, row0)
            head, self._row = self._row, None
            if drafts:
                changed = unedited != (drafts[0] if a else nxt)
                c = self.counts["changed" if changed else "unchanged"]
                c[0] += 1
                c[1] += a > 0
                if changed and not a and head is not None and nxt < len(head):
                    self.ranks[rank_bucket(int((head > head[nxt]).sum()))] += 1
            return a, nxt

        sampling.Chooser.verify = verify  # type: ignore[method-assign]
        sampling.DraftSteer.pick = pick  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from mtp_cli import sampling

        sampling.Chooser.verify = self.real  # type: ignore[method-assign]
        sampling.DraftSteer.pick = self.real_pick  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        (dc, kc), (du, ku) = self.counts["changed"], self.counts["unchanged"]
        missed = sum(self.ranks.values())
        return {
            "pos1_changed_share": dc / (dc + du) if dc + du else 0.0,
            "pos1_kept_where_changed": kc / dc if dc else 0.0,
            "pos1_kept_elsewhere": ku / du if du else 0.0,
            "pos1_missed_rank_shares": {k: v / missed for k, v in self.ranks.items()} if missed else {},
        }


def rank_bucket(rank: int) -> str:
    """Explain.RANKS' bucket of a rank (0 would be the head's own pick)."""
    return "1" if rank <= 1 else "2" if rank == 2 else "3-4" if rank <= 4 else "5+"


def library(model: Path, sidecar: Path | None, prompts: list[str], edits: dict[str, Any], args) -> dict[str, Any]:
    if args.explain:
        with Explain() as ex:
            r = _measure(model, sidecar, prompts, edits, args)
        return {**r, **ex.summary()}
    return _measure(model, sidecar, prompts, edits, args)


def _measure(model: Path, sidecar: Path | None, prompts: list[str], edits: dict[str, Any], args) -> dict[str, Any]:
    r = measure_acceptance(
        model,
        prompts,
        sidecar=str(sidecar) if sidecar else None,
        n_predict=args.n_predict,
        draft_n_max=args.draft_n_max,
        n_threads=args.threads,
        n_ctx=N_CTX,
        edits=edits,
    )
    n_tokens = r.n_tokens - len(prompts)  # (each first token is its prompt pass's)
    return pooled(list(r.drafted_at), list(r.accepted_at), n_tokens, r.n_verify)


class Server:
    """`serve`'s app (mtp_cli.serve) on a free loopback port, in a thread of this process."""

    def __init__(self, model: Path, sidecar: Path | None, args):
        import uvicorn

        from mtp_cli.serve.api import create_app
        from mtp_cli.serve.engine import Engine

        base = GenConfig(
            spec_type="mtp",
            draft_n_max=args.draft_n_max,
            n_ctx=N_CTX,
            n_threads=args.threads,
            temp=0.0,
        )
        load = LoadConfig(spec_type="mtp", draft_model=str(sidecar) if sidecar else None)
        self.engine = Engine.load(model, base, load=load).start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        self.port = sock.getsockname()[1]
        cfg = uvicorn.Config(create_app(self.engine), log_level="warning", access_log=False)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            doc = json.loads(r.read())
            if r.status != 200:
                raise SystemExit(f"serve answered {r.status}: {doc}")
            return doc
        finally:
            c.close()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.engine.close()


def request_fields(edits: dict[str, Any]) -> dict[str, Any]:
    """The setting as a request's fields (OpenAI's -100 bans a token)."""
    body = {k: v for k, v in edits.items() if k != "logit_bias"}
    if "logit_bias" in edits:
        body["logit_bias"] = {str(t): -100 if b == float("-inf") else b for t, b in edits["logit_bias"]}
    return body


def served(server: Server, prompts: list[str], edits: dict[str, Any], args) -> dict[str, Any]:
    n = args.draft_n_max
    drafted, accepted, n_tokens, n_verify = [0] * n, [0] * n, 0, 0
    for p in prompts:
        body = {
            "messages": [{"role": "user", "content": p}],
            "max_tokens": args.n_predict,
            "temperature": 0,
            **request_fields(edits),
        }
        doc = server.chat(body)
        m = doc["mtp"]
        drafted = [a + b for a, b in zip(drafted, m["drafted_by_pos"])]
        accepted = [a + b for a, b in zip(accepted, m["accepted_by_pos"])]
        n_tokens += doc["usage"]["completion_tokens"] - 1  # (the first token is the prompt pass's)
        n_verify += m["verify_passes"]
    return pooled(drafted, accepted, n_tokens, n_verify)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None, help="default: the demo model")
    ap.add_argument("-md", "--model-draft", type=Path, default=None, help="MTP sidecar")
    ap.add_argument("--prompts", type=Path, default=EVAL_PROMPTS)
    ap.add_argument("-N", "--draft-n-max", type=int, default=3)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--settings", default="plain,repeat,freq-presence,ban", help=f"of {', '.join(SETTINGS)}")
    ap.add_argument("--ban", action="append", default=None, help=f"a text whose tokens `ban` bans (default {BAN})")
    ap.add_argument("--serve", action="store_true", help="also through `serve`, per-request settings")
    ap.add_argument("--explain", action="store_true", help="first drafts where the edits changed the choice")
    ap.add_argument("--json", type=Path, default=Path("accept_bench.json"))
    args = ap.parse_args()
    lx.quiet_logs()
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in names if s not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown[0]!r} (of {', '.join(SETTINGS)})")
    if args.model is None:
        from mtp_cli.demo import demo_model

        args.model = demo_model()
    prompts = read_prompts(args.prompts)
    settings = {s: dict(SETTINGS[s]) for s in names}
    if "ban" in settings:
        settings["ban"]["logit_bias"] = banned(args.model, list(args.ban or BAN))
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    routes = ["library"] + (["serve"] if args.serve else [])
    server = Server(args.model, args.model_draft, args) if args.serve else None
    try:
        for route in routes:
            for name, edits in settings.items():
                t = time.perf_counter()
                if server is not None and route == "serve":
                    r = served(server, prompts, edits, args)
                else:
                    r = library(args.model, args.model_draft, prompts, edits, args)
                rows.append({"route": route, "setting": name, "edits": repr(edits), **r})
                print(f"{route} {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    finally:
        if server is not None:
            server.close()
    report(rows, args, len(prompts))
    out = {
        "model": str(args.model),
        "prompts_file": str(args.prompts),
        "prompts": len(prompts),
        "n_predict": args.n_predict,
        "draft_n_max": args.draft_n_max,
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


def report(rows: list[dict[str, Any]], args, n_prompts: int) -> None:
    n = args.draft_n_max
    print(f"{n_prompts} prompts x {args.n_predict} tokens, greedy, N={n}; acceptance where drafted")
    head = " | ".join(f"pos {i + 1}" for i in range(n))
    print(f"| route | setting | {head} | accepted / pass | tokens / pass | pos 1..{n} - plain's |")
    print("|---" * (n + 5) + "|")
    plain = {r["route"]: r["acceptance_by_pos"] for r in rows if r["setting"] == "plain"}
    for r in rows:
        by = r["acceptance_by_pos"]
        base = plain.get(r["route"])
        diff = " ".join(f"{a - b:+.3f}" for a, b in zip(by, base)) if base and r["setting"] != "plain" else ""
        cells = " | ".join(f"{a:.3f}" for a in by)
        print(
            f"| {r['route']} | {r['setting']} | {cells} | {r['mean_accepted_per_pass']:.2f} | "
            f"{r['tokens_per_pass']:.2f} | {diff} |"
        )
    if args.explain:
        print("first draft position: share where the edits changed the target's choice; kept there / elsewhere")
        for r in rows:
            if "pos1_changed_share" in r:
                ranks = ", ".join(f"{k}: {v:.2f}" for k, v in r["pos1_missed_rank_shares"].items())
                print(
                    f"  {r['setting']}: {r['pos1_changed_share']:.3f}; "
                    f"{r['pos1_kept_where_changed']:.3f} / {r['pos1_kept_elsewhere']:.3f}"
                    + (f"; missed there, the target's choice ranked in the head's row: {ranks}" if ranks else "")
                )


if __name__ == "__main__":
    main()
