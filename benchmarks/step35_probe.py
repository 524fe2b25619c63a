"""Prototype for Llama 3.x trunks (issue 33): can `step35`, an architecture whose MTP graph llama.cpp
runs and whose rope takes llama 3's `rope_freqs` factors, re-express a Llama-3-style trunk exactly?

    python benchmarks/step35_probe.py [--tokens 1100] [--dtype f32|q8_0]

A tiny llama file (tests/factory.py) with non-trivial rope factors and a short original context (so
the factors act), rewritten as step35: every tensor's bytes kept, Q/K rows moved whole to NEOX order
(gguf_tools.adopt.neox_order), the keys step35's loader needs (rope.dimension_count doubled: it halves
it for full-attention layers; a sliding window the size of the context with every layer marked
dense; expert_feed_forward_length). Both files are decoded by llama.cpp over the same tokens
(teacher forced); prints the largest logit difference, the top-1 agreement and the perplexities.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as T

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gguf_tools.adopt import _permuted, neox_order  # noqa: E402
from gguf_tools.gguf_file import open_gguf  # noqa: E402
from gguf_tools.gguf_write import KV, FileTensor, WritePlan, write_gguf  # noqa: E402
from gguf_tools.names import block_suffix  # noqa: E402
from gguf_tools.surgery import copy_kvs  # noqa: E402
from mtp_cli import llama_ext as lx  # noqa: E402
from tests.factory import TinySpec, write_tiny_model  # noqa: E402
from tests.hostile import edited  # noqa: E402


def llama_source(folder: Path, dtype: str) -> Path:
    spec = TinySpec(arch="llama", kind="trunk", dtype=dtype, n_trunk_layers=3, trunk_mix=1.0, llama3_rope_orig=64)  # type: ignore[arg-type]
    return write_tiny_model(folder / "llama3.gguf", spec)


def as_step35(src: Path, out: Path) -> Path:
    gf = open_gguf(src)
    a = gf.arch
    n_head, n_head_kv = int(gf.arch_get("attention.head_count")), int(gf.arch_get("attention.head_count_kv"))
    n_embd, n_layer = int(gf.arch_get("embedding_length")), int(gf.arch_get("block_count"))
    D = n_embd // n_head
    kvs = []
    for kv in copy_kvs(gf):
        if kv.key == "general.architecture":
            kvs.append(KV(kv.key, "step35", T.STRING))
        elif kv.key.startswith(a + "."):
            kvs.append(KV("step35." + kv.key[len(a) + 1 :], kv.value, kv.type, kv.sub_type, kv.raw))
        else:
            kvs.append(kv)
    kvs = [kv for kv in kvs if kv.key not in ("step35.rope.dimension_count", "step35.block_count")]
    kvs += [
        # one head block declared (its tensors may live elsewhere: llama.cpp then loads the trunk alone)
        KV("step35.block_count", n_layer + 1, T.UINT32),
        KV("step35.nextn_predict_layers", 1, T.UINT32),
        KV("step35.rope.dimension_count", 2 * D, T.UINT32),  # (step35 halves it for full-attention layers)
        KV("step35.rope.dimension_count_swa", D, T.UINT32),
        KV("step35.attention.sliding_window", int(gf.arch_get("context_length")), T.UINT32),
        # every trunk block dense; llama.cpp asserts some block is sliding-window: the head's
        KV("step35.attention.sliding_window_pattern", [0] * n_layer + [1], T.ARRAY, T.UINT32),
        KV("step35.expert_feed_forward_length", int(gf.arch_get("feed_forward_length")), T.UINT32),
    ]
    tensors = []
    for t in gf.tensors.values():
        suffix = block_suffix(t.name)
        if suffix in ("attn_q.weight", "attn_k.weight"):
            tensors.append(_permuted(gf, t, neox_order(n_head if suffix == "attn_q.weight" else n_head_kv, D)))
        else:
            tensors.append(FileTensor(t.name, t.type, t.shape, t.n_bytes, gf.path, t.offset))
    if "output.weight" not in gf.tensors:  # (step35 needs an output matrix: the tied embeddings' bytes)
        e = gf.tensors["token_embd.weight"]
        tensors.append(FileTensor("output.weight", e.type, e.shape, e.n_bytes, gf.path, e.offset))
    write_gguf(WritePlan("step35", gf.alignment, kvs, tensors), out)
    return out


def logits(path: Path, toks: list[int], flash: bool | None) -> np.ndarray:
    with lx.load_model(path) as m:
        ctx = lx.create_context(
            m, n_ctx=len(toks) + 8, n_batch=len(toks), n_threads=2, kv=lx.KvOptions(flash_attn=flash)
        )
        b = lx.Batch(len(toks))
        b.add_many(toks, 0)
        b.logits[: len(toks)] = 1
        lx.decode(ctx, b)
        return np.array(lx.logits_rows(ctx, len(toks), lx.n_vocab(m)))


def ppl(lg: np.ndarray, toks: list[int]) -> float:
    lp = lg[:-1] - (
        lg[:-1].max(1, keepdims=True) + np.log(np.exp(lg[:-1] - lg[:-1].max(1, keepdims=True)).sum(1, keepdims=True))
    )
    return float(np.exp(-lp[np.arange(len(toks) - 1), toks[1:]].mean()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1100)
    ap.add_argument("--dtype", default="f32")
    args = ap.parse_args()
    lx.quiet_logs()
    with tempfile.TemporaryDirectory() as tmp:
        src = llama_source(Path(tmp), args.dtype)
        dst = as_step35(src, Path(tmp) / "step35.gguf")
        rng = np.random.default_rng(0)
        toks = [1] + rng.integers(3, 259, args.tokens - 1).tolist()
        ref, ref_fa = logits(src, toks, False), logits(src, toks, True)
        got = logits(dst, toks, False)
        print(
            f"tokens {len(toks)}: llama vs step35 max |logit diff| {np.abs(ref - got).max():.3g}, "
            f"top-1 agreement {(ref.argmax(1) == got.argmax(1)).mean():.4f}"
        )
        print(
            f"llama FA off vs on: max |diff| {np.abs(ref - ref_fa).max():.3g}, "
            f"top-1 agreement {(ref.argmax(1) == ref_fa.argmax(1)).mean():.4f}"
        )
        print(f"perplexity: llama {ppl(ref, toks):.4f}, step35 {ppl(got, toks):.4f}")
        late = slice(len(toks) // 2, None)  # (past the original context: where the factors act)
        print(f"second half: max |diff| {np.abs(ref[late] - got[late]).max():.3g}")
        plain = logits(edited(dst, Path(tmp) / "no-factors.gguf", drop=("rope_freqs.weight",)), toks, False)
        print(
            f"control, step35 without the rope factors: max |diff| {np.abs(ref - plain).max():.3g}, "
            f"top-1 agreement {(ref.argmax(1) == plain.argmax(1)).mean():.4f}"
        )


if __name__ == "__main__":
    main()
