"""What does Gemma 4's zero-copy assistant save? The llama.cpp buffers (KV cache, compute, output)
of a gemma4-assistant drafter context, which attends over the target's KV cache, against the same
drafter as a separate model with a KV cache of its own (the same blocks, heads and context), and
against the demo model's MTP context (glm4moe: one head block with its own KV).

    python benchmarks/assistant_memory.py [--ctx 4096,32768,131072] [--json out.json]

The contexts are the ones mtp-cli's runtime makes (Runtime.contexts, n_batch 512, -fa auto), and
the sizes are the ones llama.cpp logs as it allocates each buffer. Two shapes: the test factory's
tiny pair (tests/gemma4_pair.py TINY) and one at the demo model's dimensions (DEMO: 576 wide, 3 KV
heads of 64, 49152 tokens, a 256-wide assistant).
For scale, Google's figure for Gemini Nano: 130 MB saved per instance against a separate drafter.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from mtp_cli.config import GenConfig  # noqa: E402
from mtp_cli.demo import demo_path  # noqa: E402
from mtp_cli.runtime import Runtime  # noqa: E402
from tests.gemma4_pair import DEMO, TINY, Dims, write_gemma4_pair, write_separate_drafter  # noqa: E402

N_BATCH = 512  # GenConfig's default
_LINES: list[str] = []
_BUFFER = re.compile(r"(\w+)\s+(KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")


@llama_cpp.llama_log_callback
def _keep(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    _LINES.append(text.decode("utf-8", "replace"))


def contexts(model: Path, spec: str, draft: Path | None, n_ctx: int) -> list[dict[str, float]]:
    """MiB by buffer kind (KV, compute, output) of each context the runtime makes for this spec
    (the target's, then the drafter's), from the lines llama.cpp logs as it allocates them."""
    with Runtime.load(model, spec_type=spec, draft_model=draft) as rt:
        llama_cpp.llama_log_set(_keep, ctypes.c_void_p(0))  # (the runtime silenced llama.cpp)
        _LINES.clear()
        rt.contexts(GenConfig(spec_type=spec, n_ctx=n_ctx, n_batch=N_BATCH, n_threads=1, draft_n_max=3))
        out: list[dict[str, float]] = []
        for m in _BUFFER.finditer("".join(_LINES)):
            if m.group(2) == "output":  # a context's first buffer
                out.append({})
            out[-1][m.group(2)] = out[-1].get(m.group(2), 0.0) + float(m.group(3))
    return out


def measure(dims: Dims, n_ctx: int, folder: Path) -> dict[str, dict[str, float]]:
    pair = write_gemma4_pair(folder, dims=dims)
    drafter = write_separate_drafter(folder, dims)
    target, assistant = contexts(pair.target, "mtp", pair.assistant, n_ctx)
    separate = contexts(pair.target, "draft", drafter, n_ctx)[1]
    got = {"target": target, "assistant (zero-copy)": assistant, "separate drafter": separate}
    if dims is DEMO and demo_path().is_file():  # the demo's own MTP context: its own KV for one head block
        got["demo MTP context (glm4moe)"] = contexts(demo_path(), "mtp", None, n_ctx)[1]
    return got


def _row(name: str, s: dict[str, float]) -> str:
    kv, compute, output = (s.get(k, 0.0) for k in ("KV", "compute", "output"))
    return f"  {name:<27} KV {kv:8.2f}  compute {compute:8.2f}  output {output:5.2f}  = {kv + compute + output:8.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", default="4096,32768,131072", help="context sizes, comma-separated")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, dims in (("tiny", TINY), ("demo dims", DEMO)):
            for n_ctx in (int(x) for x in a.ctx.split(",")):
                got = measure(dims, n_ctx, Path(tmp) / label.replace(" ", "-"))
                saved = sum(got["separate drafter"].values()) - sum(got["assistant (zero-copy)"].values())
                print(f"{label}, n_ctx {n_ctx}, n_batch {N_BATCH}, MiB:")
                for name, s in got.items():
                    print(_row(name, s))
                print(f"  zero-copy saves {saved:.2f} MiB against the separate drafter")
                out[f"{label} {n_ctx}"] = {"buffers_mib": got, "saved_mib": saved}
    print("Google's figure for Gemini Nano: 130 MB per instance against a separate drafter")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
