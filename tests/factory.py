"""Tiny GGUF models for tests and demos: qwen35 and glm4moe, full / trunk-only / MTP-only sidecar;
llama, qwen2 and qwen3 trunks (kind ``trunk`` only: sources for ``mtp-cli adopt``).

Everything here is built with the `gguf` package and numpy; nothing imports llama.cpp. The files
load in the llama.cpp vendored by llama-cpp-python 0.3.36.

Kinds (the same model, so `pack(trunk, sidecar)` can be compared with `full`):

- ``full``:    trunk blocks ``blk.0..n_trunk-1`` plus one MTP head block ``blk.{n_trunk}``;
               ``{arch}.block_count = n_trunk + 1``, ``{arch}.nextn_predict_layers = 1``.
- ``trunk``:   trunk blocks only; ``block_count = n_trunk``, no ``nextn_predict_layers`` key
               (what ``convert_hf_to_gguf.py --no-mtp`` writes).
- ``sidecar``: what ``convert_hf_to_gguf.py --mtp`` writes: the metadata of ``full``
               (``block_count = n_trunk + 1``, ``nextn_predict_layers = 1``) but only the head
               block's tensors plus the shared ``token_embd``, ``output_norm`` and (if untied)
               ``output``. llama.cpp detects it as MTP-only by the absence of
               ``blk.0.attn_norm.weight``; it loads as the draft model (``-md``) with
               ``load_mtp=True`` and runs only in an MTP context.

Weights:

- ``random``:     small gaussian init (1/sqrt(fan_in) matrices, N(0,1) embeddings, unit norms).
- ``structured``: the residual branches (attention/SSM output, FFN down) are scaled by
                  ``trunk_mix`` (small), so the residual stream carries the token embedding;
                  the output matrix is the embedding permuted by a fixed cycle P over the
                  ordinary tokens, so the trunk's greedy next token after x is P(x). The head's
                  ``eh_proj`` passes the embedding half through (plus ``head_noise`` gaussian
                  noise on both halves) and reuses the trunk's ``output_norm``/``output``, so the
                  head predicts P(x_p) = the target's next token: acceptance is ~100% at
                  ``head_noise=0`` and falls as the noise grows.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

Arch = Literal["qwen35", "glm4moe", "llama", "qwen2", "qwen3"]
Kind = Literal["full", "trunk", "sidecar"]
Weights = Literal["random", "structured"]
DType = Literal["f32", "f16", "q8_0"]

ARCHS: tuple[str, ...] = ("qwen35", "glm4moe")
SOURCE_ARCHS: tuple[str, ...] = ("llama", "qwen2", "qwen3")  # no MTP graph; trunk only; what adopt takes
KINDS: tuple[str, ...] = ("full", "trunk", "sidecar")
WEIGHTS: tuple[str, ...] = ("random", "structured")
DTYPES: tuple[str, ...] = ("f32", "f16", "q8_0")

# ---------------------------------------------------------------------------------------------
# tokenizer: SentencePiece-style ("llama") vocab with byte fallback
# ---------------------------------------------------------------------------------------------

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = 3
_SPACE = "\u2581"  # SentencePiece's word-boundary marker
_WORDS = ("the", "hello", "world", "a")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types): <unk>, <s>, </s>, the 256 byte tokens, then word pieces.

    Single characters ("▁", a-z) are in the vocab so SentencePiece's bigram merges can reach the
    longer pieces ("▁t" -> "▁th" -> "▁the"); everything else falls back to byte tokens.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(int(gguf.TokenType.BYTE))
        scores.append(0.0)
    pieces: list[str] = [_SPACE] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for w in _WORDS:
        for k in range(1, len(w) + 1):
            p = _SPACE + w[:k]
            if p not in pieces:
                pieces.append(p)
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(int(gguf.TokenType.NORMAL))
        # longer pieces score higher so merges prefer them; all below 0 like SentencePiece
        scores.append(-1000.0 + 10.0 * len(p) - 0.001 * i)
    return tokens, scores, types


N_VOCAB = len(tiny_vocab()[0])  # 300


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinySpec:
    arch: Arch = "qwen35"
    kind: Kind = "full"
    weights: Weights = "random"
    dtype: DType = "f32"  # type of the 2-D/3-D weight matrices; norms and 1-D tensors stay F32
    seed: int = 0

    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_trunk_layers: int = 2
    n_ctx_train: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    n_rot: int | None = None  # None: qwen35 head_dim/2 (partial rotary), glm4moe head_dim

    # qwen35 gated delta net: layer i < n_trunk is recurrent unless (i+1) % interval == 0
    full_attention_interval: int = 2
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 16  # head_k_dim == head_v_dim
    ssm_group_count: int = 2  # number of K heads
    ssm_time_step_rank: int = 4  # number of V heads

    # structured weights
    trunk_mix: float = 0.02  # scale of attention/SSM-output/FFN-down (residual branches)
    head_noise: float = 0.0  # gaussian noise on the head's eh_proj (0 = exact bigram head)

    chat_template: str = ""  # "" : CHAT_TEMPLATE
    # llama 3 rope scaling (llama only): rope_freqs.weight as convert_hf_to_gguf writes it for Llama
    # 3.1/3.2 (factor 8, low/high 1 and 4), from this original context (short: the factors act)
    llama3_rope_orig: int = 0

    # layout options
    head_optional: bool = False  # also write nextn.embed_tokens / shared_head_head / shared_head_norm
    tied_output: bool = False  # no output.weight (llama.cpp then uses token_embd)
    qkv_bias: bool | None = None  # Q/K/V biases; None: only qwen2 has them
    name: str = "tiny"

    # -- derived -----------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return N_VOCAB

    @property
    def n_nextn(self) -> int:
        return 0 if self.kind == "trunk" else 1

    @property
    def block_count(self) -> int:
        return self.n_trunk_layers + self.n_nextn

    @property
    def head_index(self) -> int:
        return self.n_trunk_layers

    @property
    def rope_dim(self) -> int:
        if self.n_rot is not None:
            return self.n_rot
        return self.head_dim // 2 if self.arch == "qwen35" else self.head_dim

    @property
    def rope_sections(self) -> list[int]:
        half = self.rope_dim // 2
        a = (half + 1) // 2
        b = (half - a + 1) // 2
        return [a, b, half - a - b, 0]

    @property
    def ssm_inner_size(self) -> int:
        return self.ssm_state_size * self.ssm_time_step_rank

    def is_recurrent(self, il: int) -> bool:
        return self.arch == "qwen35" and il < self.n_trunk_layers and (il + 1) % self.full_attention_interval != 0

    def validate(self) -> None:
        if self.arch not in ARCHS + SOURCE_ARCHS:
            raise ValueError(f"arch must be one of {ARCHS + SOURCE_ARCHS}, got {self.arch!r}")
        if self.arch in SOURCE_ARCHS and self.kind != "trunk":
            raise ValueError(f"{self.arch} has no MTP graph: only kind='trunk' exists")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {self.weights!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.n_trunk_layers < 1:
            raise ValueError("n_trunk_layers must be >= 1")
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")
        if self.rope_dim > self.head_dim or self.rope_dim % 2:
            raise ValueError("n_rot must be even and <= head_dim")
        if self.arch == "qwen35":
            recr = [self.is_recurrent(i) for i in range(self.n_trunk_layers)]
            if not any(recr) or all(recr):
                raise ValueError(
                    "qwen35 needs at least one recurrent and one full-attention trunk layer "
                    f"(n_trunk_layers={self.n_trunk_layers}, full_attention_interval={self.full_attention_interval})"
                )
            if self.ssm_time_step_rank % self.ssm_group_count:
                raise ValueError("ssm_time_step_rank must be a multiple of ssm_group_count")
        if self.dtype == "q8_0":
            for ne0 in (self.n_embd, self.n_ff, self.n_head * self.head_dim, self.ssm_inner_size):
                if ne0 % 32:
                    raise ValueError(f"q8_0 needs every matrix row length % 32 == 0; {ne0} is not")
        if self.weights == "structured" and self.tied_output:
            raise ValueError("structured weights need an untied output matrix")


# ---------------------------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------------------------

# 2-D+ tensors that stay F32 regardless of dtype (as convert_hf_to_gguf keeps them)
_KEEP_F32_SUFFIXES = ("ssm_conv1d.weight", "ffn_gate_inp.weight")


class _Gen:
    """Deterministic per-tensor RNG: a tensor's values depend only on (seed, name)."""

    def __init__(self, seed: int):
        self.seed = seed

    def rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.rng(name).standard_normal(shape) * std).astype(np.float32)


def token_permutation(spec: TinySpec) -> np.ndarray:
    """P as an array: P[x] is the structured model's greedy next token after x.

    A single cycle over the ordinary (non-special) tokens, so greedy generation never emits a
    special token and never repeats within n_vocab - 3 steps. Special tokens map to -1 (their
    successor is whatever ordinary token scores highest; deterministic but arbitrary).
    """
    n = spec.n_vocab
    order = np.random.default_rng([spec.seed, 7]).permutation(np.arange(N_SPECIAL, n))
    perm = np.full(n, -1, dtype=np.int64)
    perm[order] = np.roll(order, -1)
    return perm


def _tensor_arrays(spec: TinySpec) -> dict[str, np.ndarray]:
    """All tensors of the FULL model (F32 numpy arrays in numpy order, i.e. reversed GGUF ne)."""
    g = _Gen(spec.seed)
    structured = spec.weights == "structured"
    E, V, H, Hkv, D, F = spec.n_embd, spec.n_vocab, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_ff
    mix = spec.trunk_mix

    def lin(name: str, n_out: int, n_in: int, *, branch_out: bool = False) -> np.ndarray:
        """A linear weight (numpy shape (n_out, n_in)); residual-branch outputs get scaled by mix."""
        w = g.normal(name, (n_out, n_in), 1.0 / math.sqrt(n_in))
        if structured and branch_out:
            w *= mix
        return w

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    t: dict[str, np.ndarray] = {}
    emb = g.normal("token_embd.weight", (V, E), 1.0)
    t["token_embd.weight"] = emb
    t["output_norm.weight"] = ones(E)
    if spec.llama3_rope_orig:
        t["rope_freqs.weight"] = llama3_factors(D, spec.rope_theta, 8.0, 1.0, 4.0, spec.llama3_rope_orig)
    if structured:
        perm = token_permutation(spec)
        out = np.zeros((V, E), dtype=np.float32)
        src = np.nonzero(perm >= 0)[0]
        out[perm[src]] = emb[src]  # logits[P(x)] = <E[x], h>, the largest when h ~ E[x]
        t["output.weight"] = out
    elif not spec.tied_output:
        t["output.weight"] = lin("output.weight", V, E)

    def attn(il: int, q_gate: bool) -> None:
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = ones(E)
        t[p + "attn_q.weight"] = lin(p + "attn_q.weight", D * H * (2 if q_gate else 1), E)
        t[p + "attn_k.weight"] = lin(p + "attn_k.weight", D * Hkv, E)
        t[p + "attn_v.weight"] = lin(p + "attn_v.weight", D * Hkv, E)
        t[p + "attn_output.weight"] = lin(p + "attn_output.weight", E, D * H, branch_out=True)
        if spec.qkv_bias or (spec.qkv_bias is None and spec.arch == "qwen2"):
            for x, n in (("q", D * H), ("k", D * Hkv), ("v", D * Hkv)):
                t[p + f"attn_{x}.bias"] = g.normal(p + f"attn_{x}.bias", (n,), 0.5)
        if spec.arch in ("qwen35", "qwen3"):
            t[p + "attn_q_norm.weight"] = (
                ones(D) if spec.arch == "qwen35" else 1 + g.normal(p + "attn_q_norm.weight", (D,), 0.2)
            )
            t[p + "attn_k_norm.weight"] = (
                ones(D) if spec.arch == "qwen35" else 1 + g.normal(p + "attn_k_norm.weight", (D,), 0.2)
            )
        t[
            p
            + (
                "ffn_norm.weight"
                if spec.arch in SOURCE_ARCHS and il < spec.n_trunk_layers
                else "post_attention_norm.weight"
            )
        ] = ones(E)

    def dense_ffn(il: int) -> None:
        p = f"blk.{il}."
        t[p + "ffn_gate.weight"] = lin(p + "ffn_gate.weight", F, E)
        t[p + "ffn_up.weight"] = lin(p + "ffn_up.weight", F, E)
        t[p + "ffn_down.weight"] = lin(p + "ffn_down.weight", E, F, branch_out=True)

    def gated_delta_net(il: int) -> None:
        p = f"blk.{il}."
        dk = dv = spec.ssm_state_size
        nk, nv = spec.ssm_group_count, spec.ssm_time_step_rank
        key_dim, value_dim = dk * nk, dv * nv
        conv_dim = 2 * key_dim + value_dim
        t[p + "attn_norm.weight"] = ones(E)
        t[p + "attn_qkv.weight"] = lin(p + "attn_qkv.weight", conv_dim, E)
        t[p + "attn_gate.weight"] = lin(p + "attn_gate.weight", value_dim, E)
        t[p + "ssm_conv1d.weight"] = g.normal(
            p + "ssm_conv1d.weight", (conv_dim, spec.ssm_conv_kernel), 1.0 / math.sqrt(spec.ssm_conv_kernel)
        )
        t[p + "ssm_dt.bias"] = g.normal(p + "ssm_dt.bias", (nv,), 0.5)
        # ssm_a = -exp(A_log): negative decay rates
        t[p + "ssm_a"] = (-np.exp(g.rng(p + "ssm_a").uniform(0.0, 1.5, nv))).astype(np.float32)
        t[p + "ssm_beta.weight"] = lin(p + "ssm_beta.weight", nv, E)
        t[p + "ssm_alpha.weight"] = lin(p + "ssm_alpha.weight", nv, E)
        t[p + "ssm_norm.weight"] = ones(dv)
        t[p + "ssm_out.weight"] = lin(p + "ssm_out.weight", E, value_dim, branch_out=True)
        t[p + "post_attention_norm.weight"] = ones(E)

    for il in range(spec.n_trunk_layers):
        if spec.is_recurrent(il):
            gated_delta_net(il)
        else:
            attn(il, q_gate=spec.arch == "qwen35")
        dense_ffn(il)

    # --- the MTP head block ---
    il = spec.head_index
    p = f"blk.{il}."
    attn(il, q_gate=spec.arch == "qwen35")
    if spec.arch == "qwen35":
        dense_ffn(il)
    else:
        # glm4moe: a MoE block with one routed expert carrying the MLP (its weight is exactly 1),
        # the shared expert's down projection zero: see gguf_tools.glm4moe_head.
        from gguf_tools.glm4moe_head import single_expert_ffn

        ffn = single_expert_ffn(
            lin(p + "ffn_gate_exps.weight", F, E),
            lin(p + "ffn_up_exps.weight", F, E),
            lin(p + "ffn_down_exps.weight", E, F, branch_out=True),
            lin(p + "ffn_gate_shexp.weight", F, E),
            lin(p + "ffn_up_shexp.weight", F, E),
        )
        t.update({p + k: v for k, v in ffn.items()})
    if structured:
        eh = np.zeros((E, 2 * E), dtype=np.float32)
        eh[:, :E] = np.eye(E, dtype=np.float32)
        if spec.head_noise:
            eh += g.normal(p + "nextn.eh_proj.noise", (E, 2 * E), spec.head_noise / math.sqrt(E))
        t[p + "nextn.eh_proj.weight"] = eh
    else:
        t[p + "nextn.eh_proj.weight"] = lin(p + "nextn.eh_proj.weight", E, 2 * E)
    t[p + "nextn.enorm.weight"] = ones(E)
    t[p + "nextn.hnorm.weight"] = ones(E)
    if spec.head_optional:
        t[p + "nextn.embed_tokens.weight"] = emb.copy()
        t[p + "nextn.shared_head_head.weight"] = (t["output.weight"] if "output.weight" in t else emb).copy()
        t[p + "nextn.shared_head_norm.weight"] = ones(E)
    return t


def _is_head_tensor(name: str, spec: TinySpec) -> bool:
    return name.startswith(f"blk.{spec.head_index}.")


def _select(spec: TinySpec, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if spec.kind == "full":
        return dict(tensors)
    if spec.kind == "trunk":
        return {k: v for k, v in tensors.items() if not _is_head_tensor(k, spec)}
    shared = ("token_embd.weight", "output_norm.weight", "output.weight")
    return {k: v for k, v in tensors.items() if _is_head_tensor(k, spec) or k in shared}


def _encode(name: str, arr: np.ndarray, dtype: str) -> tuple[np.ndarray, QT | None]:
    if arr.ndim < 2 or name.endswith(_KEEP_F32_SUFFIXES) or dtype == "f32":
        return np.ascontiguousarray(arr, dtype=np.float32), None
    if dtype == "f16":
        return np.ascontiguousarray(arr, dtype=np.float16), None
    if arr.shape[-1] % 32:
        raise ValueError(f"q8_0: {name} row length {arr.shape[-1]} is not a multiple of 32")
    return gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), QT.Q8_0), QT.Q8_0


_FILE_TYPE = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


def _write_metadata(w: gguf.GGUFWriter, spec: TinySpec) -> None:
    a = spec.arch
    w.add_name(f"{spec.name}-{a}-{spec.weights}")  # the same model whatever the kind (full, trunk, sidecar)
    w.add_file_type(int(_FILE_TYPE[spec.dtype]))
    if spec.dtype == "q8_0":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.block_count)
    if spec.n_nextn:
        w.add_nextn_predict_layers(spec.n_nextn)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_rope_dimension_count(spec.rope_dim)
    w.add_vocab_size(spec.n_vocab)

    if a == "qwen35":
        w.add_rope_dimension_sections(spec.rope_sections)
        w.add_full_attention_interval(spec.full_attention_interval)
        w.add_ssm_conv_kernel(spec.ssm_conv_kernel)
        w.add_ssm_state_size(spec.ssm_state_size)
        w.add_ssm_group_count(spec.ssm_group_count)
        w.add_ssm_time_step_rank(spec.ssm_time_step_rank)
        w.add_ssm_inner_size(spec.ssm_inner_size)
    elif a == "glm4moe":
        w.add_leading_dense_block_count(spec.n_trunk_layers)
        w.add_expert_count(1)
        w.add_expert_used_count(1)
        w.add_expert_shared_count(1)
        w.add_expert_feed_forward_length(spec.n_ff)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

    add_tiny_vocab(w)
    w.add_add_space_prefix(True)
    w.add_chat_template(spec.chat_template or CHAT_TEMPLATE)


def add_tiny_vocab(w: gguf.GGUFWriter) -> None:
    """The tiny vocabulary and its special tokens, as every tiny model here carries them."""
    tokens, scores, types = tiny_vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def llama3_factors(head_dim: int, theta: float, factor: float, low: float, high: float, orig: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel rope_freqs for rope_type llama3."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_wl, high_wl = orig / low, orig / high
    out = []
    for f in freqs:
        wl = 2 * np.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (orig / wl - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write_tiny_model(path: str | Path, spec: TinySpec) -> Path:
    """Write one tiny GGUF described by `spec` to `path`; returns the path."""
    spec.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = _select(spec, _tensor_arrays(spec))
    w = gguf.GGUFWriter(path, spec.arch)
    _write_metadata(w, spec)
    for name, arr in tensors.items():
        data, raw = _encode(name, arr, spec.dtype)
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_model_set(
    directory: str | Path,
    arch: Arch = "qwen35",
    weights: Weights = "random",
    dtype: DType = "f32",
    seed: int = 0,
    **overrides: object,
) -> dict[str, Path]:
    """Write full / trunk / sidecar files of the SAME model into `directory`.

    Trunk tensors are bit-identical in full and trunk, head tensors in full and sidecar, and the
    shared token_embd / output_norm / output in all three. Extra TinySpec fields via `overrides`.
    Returns {"full": path, "trunk": path, "sidecar": path}.
    """
    directory = Path(directory)
    base = TinySpec(arch=arch, weights=weights, dtype=dtype, seed=seed, **overrides)  # type: ignore[arg-type]
    tag = f"-{zlib.crc32(repr(sorted(overrides.items())).encode()):08x}" if overrides else ""
    out: dict[str, Path] = {}
    for kind in KINDS:
        spec = replace(base, kind=kind)
        out[kind] = write_tiny_model(directory / f"tiny-{arch}-{weights}-{dtype}-s{seed}{tag}-{kind}.gguf", spec)
    return out
