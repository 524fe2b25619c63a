"""Run a GGUF through llama.cpp with mtp-cli's header check switched off: load, make a context (and,
with --mtp, an MTP context beside it), tokenize with the special tokens, decode a few tokens twice.

    python -m tests.llama_probe FILE [--mtp]

Exit 0: llama.cpp ran it. Exit 3: llama.cpp refused it (a NULL model or context, a failed decode).
Anything else (a signal, a hang the caller times out) is llama.cpp crashing on it. Used by
tests/test_hostile.py to show that each rule in gguf_tools.limits guards against a real failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mtp_cli.llama_ext as lx
from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext import models


def load_unchecked(path: str, mtp: bool) -> lx.Model:
    """llama_model_load_from_file on the file as it is: none of mtp-cli's checks (the point)."""
    lx.init_backend()
    params = models._C.llama_model_default_params()
    params.load_mtp = mtp
    model = models._C.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise LlamaError("llama.cpp failed to load the model")
    return lx.Model(model, lx.ModelInfo(Path(path), mtp, int(models._C.llama_model_n_layer_nextn(model)), False))


def main(path: str, mtp: bool) -> int:
    lx.quiet_logs()
    try:
        model = load_unchecked(path, mtp)
        ctx = lx.create_context(model, n_ctx=128, n_batch=64)
        if mtp:
            lx.create_context(model, n_ctx=128, n_batch=64, ctx_type=lx.CTX_TYPE_MTP, ctx_other=ctx)
        toks = lx.tokenize(model, "hello world the a", add_special=True)
        batch = lx.Batch(64)
        for step in range(2):
            batch.clear()
            batch.add_many(toks, step * len(toks), logits_last=True)
            lx.decode(ctx, batch)
    except LlamaError as e:
        print(f"refused: {e}")
        return 3
    print("ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--mtp" in sys.argv[2:]))
