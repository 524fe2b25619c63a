"""A tiny gemma4 target and its gemma4-assistant drafter, random weights, written with gguf's writer.

The target: 4 blocks, sliding-window layers 0-2 and a global layer 3 (with rope_freqs), no per-layer
embeddings. The assistant: 2 Q-only blocks (one sliding-window, one global), which llama.cpp maps onto
the target's last sliding-window and last global layers' KV cache (llama-model.cpp, the memory of
LLM_ARCH_GEMMA4_ASSISTANT), pre_projection (target token embedding ++ target h -> assistant width)
and post_projection (back to the target's width). Tensor names and shapes as src/models/gemma4.cpp
and gemma4-assistant.cpp create them. (Not yet checked against convert_hf_to_gguf.py's output for
transformers' Gemma4ForCausalLM / Gemma4AssistantForCausalLM: issue 21.)
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.factory import add_tiny_vocab, tiny_vocab

E, H, HKV, D, FF = 64, 4, 2, 16, 128  # target width, heads, KV heads, head size (global = SWA), FFN
TARGET_PATTERN = (True, True, True, False)  # sliding-window per block
ASSISTANT_PATTERN = (True, False)
ASSISTANT_E = 32


def _common(w: gguf.GGUFWriter, arch: str, n_embd: int, pattern: tuple[bool, ...]) -> None:
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(pattern))
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(D)
    w.add_uint32(f"{arch}.rope.dimension_count_swa", D)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    w.add_uint32(f"{arch}.attention.sliding_window", 16)
    w.add_uint32(f"{arch}.attention.key_length_swa", D)
    w.add_uint32(f"{arch}.attention.value_length_swa", D)
    w.add_array(f"{arch}.attention.sliding_window_pattern", list(pattern))
    add_tiny_vocab(w)
    w.add_add_space_prefix(True)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _block(w: gguf.GGUFWriter, mat, i: int, n_embd: int, kv: bool) -> None:
    p, ones = f"blk.{i}.", lambda n: np.ones(n, np.float32)  # noqa: E731
    w.add_tensor(p + "attn_norm.weight", ones(n_embd))
    w.add_tensor(p + "attn_q.weight", mat(H * D, n_embd))
    if kv:
        w.add_tensor(p + "attn_k.weight", mat(HKV * D, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(HKV * D, n_embd))
        w.add_tensor(p + "attn_k_norm.weight", ones(D))
    else:
        w.add_tensor(p + "layer_output_scale.weight", ones(1))
    w.add_tensor(p + "attn_output.weight", mat(n_embd, H * D))
    w.add_tensor(p + "attn_q_norm.weight", ones(D))
    w.add_tensor(p + "post_attention_norm.weight", ones(n_embd))
    w.add_tensor(p + "ffn_norm.weight", ones(n_embd))
    w.add_tensor(p + "ffn_gate.weight", mat(FF, n_embd))
    w.add_tensor(p + "ffn_up.weight", mat(FF, n_embd))
    w.add_tensor(p + "ffn_down.weight", mat(n_embd, FF))
    w.add_tensor(p + "post_ffw_norm.weight", ones(n_embd))


def write_gemma4_pair(folder: Path, seed: int = 0, target_width: int = E, agree: bool = False) -> dict[str, Path]:
    """{"target": ..., "assistant": ...}; `target_width` other than E writes an assistant for another
    target. `agree`: both final norms zero, so every logit is 0 and both always choose token 0 (the
    first maximum): every draft is accepted (the random pair's are all rejected)."""
    rng = np.random.default_rng(seed)
    mat = lambda *shape, std=0.05: (rng.standard_normal(shape) * std).astype(np.float32)  # noqa: E731
    n_vocab = len(tiny_vocab()[0])
    folder.mkdir(parents=True, exist_ok=True)
    out = {"target": folder / "gemma4.gguf", "assistant": folder / f"gemma4-assistant-{target_width}.gguf"}
    final = np.zeros if agree else np.ones
    w = gguf.GGUFWriter(str(out["target"]), "gemma4")
    _common(w, "gemma4", E, TARGET_PATTERN)
    w.add_uint32("gemma4.embedding_length_per_layer_input", 0)
    w.add_tensor("token_embd.weight", mat(n_vocab, E, std=1.0))
    w.add_tensor("output_norm.weight", final(E, np.float32))
    w.add_tensor("rope_freqs.weight", np.ones(D // 2, np.float32))
    for i in range(len(TARGET_PATTERN)):
        _block(w, mat, i, E, kv=True)
    _finish(w)
    a = "gemma4-assistant"
    w = gguf.GGUFWriter(str(out["assistant"]), a)
    _common(w, a, ASSISTANT_E, ASSISTANT_PATTERN)
    w.add_nextn_predict_layers(len(ASSISTANT_PATTERN))
    w.add_uint32(f"{a}.embedding_length_out", target_width)
    w.add_tensor("token_embd.weight", mat(n_vocab, ASSISTANT_E, std=1.0))
    w.add_tensor("output_norm.weight", final(ASSISTANT_E, np.float32))
    w.add_tensor("rope_freqs.weight", np.ones(D // 2, np.float32))
    w.add_tensor("nextn.pre_projection.weight", mat(ASSISTANT_E, 2 * target_width))
    w.add_tensor("nextn.post_projection.weight", mat(target_width, ASSISTANT_E))
    for i in range(len(ASSISTANT_PATTERN)):
        _block(w, mat, i, ASSISTANT_E, kv=False)
    _finish(w)
    return out
