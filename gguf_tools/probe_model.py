"""Tiny llama models written on the fly to probe this machine's llama.cpp.

The CPU self-check's (mtp_cli.cpu_check): shapes the smallest that every CPU weight path takes:
rows of 64 and 128 (AMX wants multiples of 32 rows and of 32 or 256 columns, the repack kernels
groups of 8 rows), a vocabulary of 288 tokens (9 x 32) so the output matrix goes the same way.

The attention probe's (mtp_cli.attention_probe): a model's attention shape (heads, KV heads, head
sizes, layers) over a 64-wide residual and a 64-wide MLP, so that a decode costs about what the
model's attention costs and little else. Random weights: only what a decode costs, or whether it
runs, matters, not what it says.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

PROBE_TYPES = ("q4_0", "q8_0")  # the types whose batched decode died in llama.cpp #20824
N_EMBD, N_FF, N_HEAD, N_VOCAB = 64, 128, 2, 288


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    while len(tokens) < N_VOCAB:
        tokens.append("\u2581" + chr(ord("a") + len(tokens) - 259))
        types.append(gguf.TokenType.NORMAL)
    return tokens, [0.0] * N_VOCAB, [int(t) for t in types]


def _add_vocab(w: gguf.GGUFWriter) -> None:
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def write_probe_model(path: Path, qtype: str) -> Path:
    """One block of llama, its matrices in `qtype` (one of PROBE_TYPES)."""
    qt = gguf.GGMLQuantizationType[qtype.upper()]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"mtp-cli cpu probe {qtype}")
    w.add_file_type(int(gguf.LlamaFileType["MOSTLY_" + qtype.upper()]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(64)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    _add_vocab(w)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = rng.standard_normal((rows, cols), dtype=np.float32) * 0.1
        w.add_tensor(name, gguf.quants.quantize(data, qt), raw_dtype=qt)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(N_EMBD, dtype=np.float32))

    matrix("token_embd.weight", N_VOCAB, N_EMBD)
    norm("output_norm.weight")
    matrix("output.weight", N_VOCAB, N_EMBD)
    norm("blk.0.attn_norm.weight")
    norm("blk.0.ffn_norm.weight")
    for t in ("q", "k", "v", "output"):
        matrix(f"blk.0.attn_{t}.weight", N_EMBD, N_EMBD)
    matrix("blk.0.ffn_gate.weight", N_FF, N_EMBD)
    matrix("blk.0.ffn_up.weight", N_FF, N_EMBD)
    matrix("blk.0.ffn_down.weight", N_EMBD, N_FF)
    return _finish(w, path)


def _finish(w: gguf.GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_attention_probe(
    path: Path, n_layer: int, n_head: int, n_head_kv: int, d_k: int, d_v: int, n_ctx: int
) -> Path:
    """`n_layer` blocks of llama with this attention shape, F16 matrices, a 64-wide residual."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("mtp-cli attention probe")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    w.add_context_length(n_ctx)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_EMBD)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(d_k)
    w.add_value_length(d_v)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d_k)
    _add_vocab(w)

    def matrix(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * 0.1).astype(np.float16))

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(N_EMBD, dtype=np.float32))

    matrix("token_embd.weight", N_VOCAB, N_EMBD)
    norm("output_norm.weight")
    matrix("output.weight", N_VOCAB, N_EMBD)
    for i in range(n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", n_head * d_k, N_EMBD)
        matrix(f"blk.{i}.attn_k.weight", n_head_kv * d_k, N_EMBD)
        matrix(f"blk.{i}.attn_v.weight", n_head_kv * d_v, N_EMBD)
        matrix(f"blk.{i}.attn_output.weight", N_EMBD, n_head * d_v)
        for t in ("gate", "up", "down"):
            matrix(f"blk.{i}.ffn_{t}.weight", N_EMBD, N_EMBD)
    return _finish(w, path)


__all__ = ["PROBE_TYPES", "write_attention_probe", "write_probe_model"]
