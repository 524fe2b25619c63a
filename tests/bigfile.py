"""Big loadable models for the write benchmarks and fault tests: a llama model of about `gb` GB whose
Q8_0 weights are random bytes (copied from one blob, so making it costs one write of the file),
with a GPT-2 style vocabulary and merges as large as a Qwen model's unless told otherwise."""

from __future__ import annotations

from pathlib import Path

N_VOCAB, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 151936, 2048, 8192, 16, 4, 128  # a Qwen-sized vocabulary


def _q8_bytes(ne0: int, ne1: int) -> int:
    return ne0 // 32 * 34 * ne1


def _llama_kvs(n_layer: int, n_vocab: int) -> list:
    """A llama header as convert_hf_to_gguf writes one, with a GPT-2 style vocabulary and merges."""
    from gguf import GGUFValueType as T

    from gguf_tools.gguf_write import KV

    a = "llama"
    tokens = [f"tok{i:06d}" + "x" * (i % 7) for i in range(n_vocab)]
    merges = [f"tok{i:06d} x{i % 97}" for i in range(max(n_vocab - 549, 1))]
    return [
        KV("general.architecture", a, T.STRING),
        KV("general.name", "pack-bench", T.STRING),
        KV(f"{a}.block_count", n_layer, T.UINT32),
        KV(f"{a}.context_length", 32768, T.UINT32),
        KV(f"{a}.embedding_length", N_EMBD, T.UINT32),
        KV(f"{a}.feed_forward_length", N_FF, T.UINT32),
        KV(f"{a}.attention.head_count", N_HEAD, T.UINT32),
        KV(f"{a}.attention.head_count_kv", N_HEAD_KV, T.UINT32),
        KV(f"{a}.rope.freq_base", 1e6, T.FLOAT32),
        KV(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, T.FLOAT32),
        KV(f"{a}.rope.dimension_count", HEAD_DIM, T.UINT32),
        KV(f"{a}.vocab_size", n_vocab, T.UINT32),
        KV("tokenizer.ggml.model", "gpt2", T.STRING),
        KV("tokenizer.ggml.pre", "qwen2", T.STRING),
        KV("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        KV("tokenizer.ggml.token_type", [1] * n_vocab, T.ARRAY, T.INT32),
        KV("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING),
        KV("tokenizer.ggml.bos_token_id", 1, T.UINT32),
        KV("tokenizer.ggml.eos_token_id", 2, T.UINT32),
    ]


def make_pack_inputs(folder: Path, gb: float, n_vocab: int = N_VOCAB) -> tuple[Path, Path]:
    """A llama model of about `gb` GB (random Q8_0 bytes from one blob), adopted with a head slot;
    then the trunk and the head as a sidecar, as a user who packs would have them."""
    # Heavy imports stay in the child that makes the files: each measured process is forked from a
    # small parent, since a forked child's peak RSS counts the parent's memory until exec.
    import numpy as np
    from gguf import GGMLQuantizationType

    from gguf_tools import ops
    from gguf_tools.gguf_write import ArrayTensor, FileTensor, WritePlan, write_gguf

    Q8, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
    qd, kvd = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    mats = {"attn_q": (N_EMBD, qd), "attn_k": (N_EMBD, kvd), "attn_v": (N_EMBD, kvd), "attn_output": (qd, N_EMBD)}
    mats |= {"ffn_gate": (N_EMBD, N_FF), "ffn_up": (N_EMBD, N_FF), "ffn_down": (N_FF, N_EMBD)}
    per_layer = sum(_q8_bytes(*s) for s in mats.values())
    emb_bytes = _q8_bytes(N_EMBD, n_vocab)
    n_layer = max(1, round((gb * 1e9 - emb_bytes) / per_layer))
    blob, blob_bytes = folder / "blob.bin", max(emb_bytes, *(_q8_bytes(*s) for s in mats.values()))
    rng = np.random.default_rng(0)
    with open(blob, "wb") as f:
        for _ in range(0, blob_bytes, 64 << 20):
            f.write(rng.integers(0, 256, size=min(64 << 20, blob_bytes - f.tell()), dtype=np.uint8).tobytes())
    ones = np.ones(N_EMBD, np.float32)
    tensors: list = [FileTensor("token_embd.weight", Q8, (N_EMBD, n_vocab), emb_bytes, blob, 0)]
    for i in range(n_layer):
        tensors += [ArrayTensor(f"blk.{i}.attn_norm.weight", F32, (N_EMBD,), ones)]
        tensors += [FileTensor(f"blk.{i}.{n}.weight", Q8, s, _q8_bytes(*s), blob, 0) for n, s in mats.items()]
        tensors += [ArrayTensor(f"blk.{i}.ffn_norm.weight", F32, (N_EMBD,), ones)]
    tensors.append(ArrayTensor("output_norm.weight", F32, (N_EMBD,), ones))
    src, full = folder / "llama.gguf", folder / "full.gguf"
    write_gguf(WritePlan("llama", 32, _llama_kvs(n_layer, n_vocab), tensors), src)
    blob.unlink()
    from gguf_tools.adopt import plan_adopt
    from gguf_tools.gguf_file import open_gguf

    ops.write_plan(plan_adopt(open_gguf(src), with_head_slot=True, head_type="q8_0"), full)  # a Q8_0 model's head
    src.unlink()
    trunk, sidecar = folder / "trunk.gguf", folder / "sidecar.gguf"
    ops.strip(full, trunk)
    ops.extract(full, sidecar)
    full.unlink()
    return trunk, sidecar
