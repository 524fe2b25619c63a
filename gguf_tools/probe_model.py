"""A tiny quantized llama model, written on the fly for the CPU self-check (mtp_cli.cpu_check).

Its shapes are the smallest that every CPU weight path takes: rows of 64 and 128 (AMX wants
multiples of 32 rows and of 32 or 256 columns, the repack kernels groups of 8 rows), a vocabulary
of 288 tokens (9 x 32) so the output matrix goes the same way. Random weights: only whether a
batched decode runs matters, not what it says.
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
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


__all__ = ["PROBE_TYPES", "write_probe_model"]
