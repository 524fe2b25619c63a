"""One process's generations through llama.cpp RPC (its servers stay registered for the process's life,
so the RPC tests run here, apart from the test session): prints one JSON line.

    python -m tests.rpc_child MODEL '{"rpc": ["127.0.0.1:PORT"], "runs": [{"spec_type": "none"}, ...]}'
"""

from __future__ import annotations

import json
import sys

from mtp_cli import llama_ext as lx
from mtp_cli.config import GenConfig, Placement
from mtp_cli.runtime import Runtime


def main(model: str, spec: dict) -> dict:
    lx.quiet_logs()
    placement = Placement(rpc=tuple(spec.get("rpc", ())), n_gpu_layers_draft=spec.get("ngld"))
    out: dict = {"runs": []}
    with Runtime.load(model, spec_type="mtp", n_gpu_layers=spec.get("ngl", 99), placement=placement) as rt:
        out["devices"] = [d.name for d in lx.devices()]
        out["draft"] = str(rt.draft_path) if rt.draft_path else None
        prompt = rt.tokenize("hello world the")
        for run in spec["runs"]:
            cfg = GenConfig(temp=0.0, n_predict=24, n_threads=1, n_ctx=256, **run)
            gen = rt.generate(prompt, cfg)
            toks = [e.token for e in gen]
            out["runs"].append({"tokens": toks, "accepted": gen.stats.n_accepted, "drafted": gen.stats.n_drafted})
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
