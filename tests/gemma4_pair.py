"""A tiny gemma4 target and its gemma4-assistant drafter, written with gguf's writer in the layout
llama.cpp's converter gives Gemma4ForCausalLM and Gemma4AssistantForCausalLM
(benchmarks/gemma4_layout.py compares them key by key and tensor by tensor).

The target (TINY): 4 blocks, sliding-window layers 0-2 (head size 16) and a global layer 3 (head
size 32, proportional rope through rope_freqs), per-layer embeddings. The assistant: 2 Q-only blocks (one
sliding-window, one global), which llama.cpp maps onto the target's last sliding-window and last
global layers' KV cache (llama-model.cpp, the memory of LLM_ARCH_GEMMA4_ASSISTANT), pre_projection
(target token embedding ++ target h -> assistant width) and post_projection (back to the target's
width).

Random weights by default: the assistant's drafts are all rejected. `agree=f` writes a structured
pair instead: every block is an identity (its post-norms zero), so the target is a bigram model whose
next token after t is `order`'s successor of t (an untied output matrix), and the assistant, reading
only the token embedding through pre_projection, predicts the same successor for a fraction f of
the tokens (`agreeing`) and another token for the rest. Acceptance and rollback both run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np

from tests.factory import BOS_ID, EOS_ID, UNK_ID, tiny_vocab


@dataclass(frozen=True)
class Dims:
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int | None = 2  # None: no head_count_kv key (llama.cpp then takes head_count)
    n_ff: int = 128
    head: int = 16  # head size of the sliding-window blocks
    head_global: int = 32  # of the global blocks
    pattern: tuple[bool, ...] = (True, True, True, False)  # sliding-window per target block
    assistant_embd: int = 32
    assistant_pattern: tuple[bool, ...] = (True, False)
    per_layer: int = 8  # per-layer input width (E2B/E4B have them; an assistant never does)
    n_vocab: int = len(tiny_vocab()[0])  # the tiny vocabulary, padded with user-defined tokens
    swa: int = 16  # sliding window
    shared_kv: int = 0  # the target's last blocks that reuse an earlier block's KV (E2B's do)


TINY = Dims()
# The demo model's (SmolLM2-135M: 576 wide, 9 heads, 3 KV heads of 64, a 49152-token vocabulary)
# with Gemma 4 E2B's window, and a 256-wide assistant; two target blocks (what the assistant reads)
# suffice for its buffers.
DEMO = Dims(576, 9, 3, 1536, 64, 64, (True, False), 256, (True, False), 0, 49152, 512)
SWA, N_CTX_TRAIN = TINY.swa, 4096  # sliding window, training context
ROPE_BASE, ROPE_BASE_SWA, PARTIAL_ROTARY = 1e6, 1e4, 0.25  # transformers' Gemma4TextConfig defaults


@dataclass
class Gemma4Pair:
    target: Path
    assistant: Path
    order: list[int] = field(default_factory=list)  # structured: the target's successor of order[i] is order[i+1]
    agreeing: frozenset[int] = frozenset()  # structured: the tokens whose successor the assistant predicts

    def successor(self, t: int) -> int:
        return self.order[(self.order.index(t) + 1) % len(self.order)]


def _vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
    tokens, scores, types = tiny_vocab()
    extra = n_vocab - len(tokens)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens + [f"<extra_{i}>" for i in range(extra)])
    w.add_token_scores(scores + [0.0] * extra)
    w.add_token_types(types + [int(gguf.TokenType.USER_DEFINED)] * extra)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)


def _common(w: gguf.GGUFWriter, dims: Dims, n_embd: int, pattern: tuple[bool, ...], dg: int, n_vocab: int) -> None:
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(pattern))
    w.add_feed_forward_length(dims.n_ff)
    w.add_head_count(dims.n_head)
    if dims.n_head_kv is not None:
        w.add_head_count_kv(dims.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(dims.swa)
    w.add_key_length(dg)
    w.add_value_length(dg)
    w.add_key_length_swa(dims.head)
    w.add_value_length_swa(dims.head)
    w.add_rope_dimension_count(dg)
    w.add_rope_dimension_count_swa(dims.head)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_rope_freq_base_swa(ROPE_BASE_SWA)
    w.add_sliding_window_pattern(list(pattern))
    _vocab(w, n_vocab)


def _rope_freqs(dg: int) -> np.ndarray:
    """The converter's proportional rope: the first PARTIAL_ROTARY of the pairs rotate, the rest
    get a factor so large they stay put."""
    n_rot = int(dg * PARTIAL_ROTARY / 2)
    return np.array([1.0] * n_rot + [1e30] * (dg // 2 - n_rot), np.float32)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@dataclass
class _Block:
    n_embd: int
    head: int
    kv: bool  # own K and V (a target's block) or Q only (an assistant's)
    post: float  # the FFN's (and per-layer input's) post-norm: 0 makes them add nothing
    attn: float  # the attention's post-norm
    per_layer: int


def _block(w: gguf.GGUFWriter, mat, i: int, dims: Dims, b: _Block) -> None:
    p, ones, e, hd = f"blk.{i}.", lambda n: np.ones(n, np.float32), b.n_embd, b.head  # noqa: E731
    w.add_tensor(p + "attn_norm.weight", ones(e))
    w.add_tensor(p + "attn_q.weight", mat(dims.n_head * hd, e))
    if b.kv:
        kv = dims.n_head_kv or dims.n_head
        w.add_tensor(p + "attn_k.weight", mat(kv * hd, e))
        w.add_tensor(p + "attn_v.weight", mat(kv * hd, e))
        w.add_tensor(p + "attn_k_norm.weight", ones(hd))
    w.add_tensor(p + "layer_output_scale.weight", ones(1))
    w.add_tensor(p + "attn_output.weight", mat(e, dims.n_head * hd))
    w.add_tensor(p + "attn_q_norm.weight", ones(hd))
    w.add_tensor(p + "post_attention_norm.weight", b.attn * ones(e))  # a contribution passes these norms
    w.add_tensor(p + "ffn_norm.weight", ones(e))
    w.add_tensor(p + "ffn_gate.weight", mat(dims.n_ff, e))
    w.add_tensor(p + "ffn_up.weight", mat(dims.n_ff, e))
    w.add_tensor(p + "ffn_down.weight", mat(e, dims.n_ff))
    w.add_tensor(p + "post_ffw_norm.weight", b.post * ones(e))
    if b.per_layer:
        w.add_tensor(p + "inp_gate.weight", mat(b.per_layer, e))
        w.add_tensor(p + "proj.weight", mat(e, b.per_layer))
        w.add_tensor(p + "post_norm.weight", b.post * ones(e))


def _structure(rng, n_vocab: int, agree: float) -> tuple[list[int], frozenset[int], np.ndarray]:
    """A cycle through every token but UNK and BOS (EOS on it, so every run ends), the tokens whose
    successor the assistant gets right, and the assistant's successor map (a permutation)."""
    order = [int(t) for t in rng.permutation([t for t in range(n_vocab) if t not in (UNK_ID, BOS_ID)])]
    nxt = {t: order[(i + 1) % len(order)] for i, t in enumerate(order)}
    agreeing = frozenset(t for t in order if rng.random() < agree)
    wrong = [t for t in order if t not in agreeing]
    mapped = {t: nxt[t] for t in agreeing}
    if len(wrong) == 1:  # (no derangement of one token: it agrees)
        agreeing, wrong = agreeing | set(wrong), []
        mapped.update((t, nxt[t]) for t in agreeing)
    for i, t in enumerate(wrong):  # a derangement of the rest: never the true successor
        mapped[t] = nxt[wrong[(i + 1) % len(wrong)]]
    succ = np.arange(n_vocab)
    for t, s in mapped.items():
        succ[t] = s
    return order, agreeing, succ


def _rng_mat(seed: int):
    rng = np.random.default_rng(seed)
    return rng, lambda *shape, std=0.05: (rng.standard_normal(shape) * std).astype(np.float32)


def write_gemma4_pair(
    folder: Path,
    seed: int = 0,
    target_width: int | None = None,
    agree: float | None = None,
    assistant_dg: int | None = None,
    assistant_extra_tokens: int = 0,
    context_mix: float = 0.0,
    dims: Dims = TINY,
    assistant_kv_heads: int | None = None,
) -> Gemma4Pair:
    """The pair in `folder`. `target_width`, `assistant_dg`, `assistant_extra_tokens` and
    `assistant_kv_heads` other than the defaults write an assistant for another target (its width,
    global head size, vocabulary, KV heads).
    `context_mix` (structured pairs): the target's attention adds a vector of this RMS to each block's
    residual (the token embedding's is 8), so that some of its tokens depend on the context and a
    wrong rollback of its cache shows in the output."""
    rng, mat = _rng_mat(seed)
    width, dg = target_width or dims.n_embd, assistant_dg or dims.head_global
    n_vocab, a_e = dims.n_vocab, dims.assistant_embd
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"{dims.n_embd}-{dims.n_head_kv}-{seed}" + ("" if agree is None else f"-agree{agree}-mix{context_mix}")
    a_dims = dims if assistant_kv_heads is None else replace(dims, n_head_kv=assistant_kv_heads)
    mine = (width, dg, assistant_extra_tokens, a_dims.n_head_kv)
    other = mine != (dims.n_embd, dims.head_global, 0, dims.n_head_kv)
    pair = Gemma4Pair(
        folder / f"gemma4-{tag}.gguf",
        folder / f"gemma4-assistant-{tag}{'-for-' + '-'.join(map(str, mine)) if other else ''}.gguf",
    )
    post = 1.0 if agree is None else 0.0
    embd = mat(n_vocab, dims.n_embd, std=1.0)
    w = gguf.GGUFWriter(str(pair.target), "gemma4")
    _common(w, dims, dims.n_embd, dims.pattern, dims.head_global, n_vocab)
    w.add_shared_kv_layers(dims.shared_kv)
    w.add_embedding_length_per_layer_input(dims.per_layer)
    w.add_tensor("token_embd.weight", embd)
    if agree is not None:
        pair.order, pair.agreeing, succ = _structure(rng, n_vocab, agree)
        out = np.zeros_like(embd)
        for i, t in enumerate(pair.order):  # row successor(t) is t's embedding: h(t) scores it highest
            out[pair.order[(i + 1) % len(pair.order)]] = embd[t]
        w.add_tensor("output.weight", out)
    if dims.per_layer:
        n_pl = dims.per_layer * len(dims.pattern)
        w.add_tensor("per_layer_token_embd.weight", mat(n_vocab, n_pl, std=1.0))
        w.add_tensor("per_layer_model_proj.weight", mat(n_pl, dims.n_embd))
        w.add_tensor("per_layer_proj_norm.weight", np.ones(dims.per_layer, np.float32))
    w.add_tensor("output_norm.weight", np.ones(dims.n_embd, np.float32))
    w.add_tensor("rope_freqs.weight", _rope_freqs(dims.head_global))
    for i, swa in enumerate(dims.pattern):
        hd = dims.head if swa else dims.head_global
        _block(w, mat, i, dims, _Block(dims.n_embd, hd, True, post, post or context_mix, dims.per_layer))
    _finish(w)

    a = "gemma4-assistant"
    w = gguf.GGUFWriter(str(pair.assistant), a)
    _common(w, a_dims, a_e, dims.assistant_pattern, dg, n_vocab + assistant_extra_tokens)
    w.add_shared_kv_layers(len(dims.assistant_pattern))
    w.add_embedding_length_per_layer_input(0)
    w.add_embedding_length_out(width)
    w.add_nextn_predict_layers(len(dims.assistant_pattern))
    pre = mat(a_e, 2 * width)
    a_embd = mat(n_vocab + assistant_extra_tokens, a_e, std=1.0)
    if agree is not None:  # reads the token's embedding (its first a_e values) and nothing of h
        pre = np.zeros_like(pre)
        pre[:, :a_e] = np.eye(a_e, dtype=np.float32)
        a_embd[succ] = embd[: len(succ), :a_e]  # row succ[t] is t's: the assistant predicts succ[t]
    w.add_tensor("token_embd.weight", a_embd)
    w.add_tensor("output_norm.weight", np.ones(a_e, np.float32))
    w.add_tensor("rope_freqs.weight", _rope_freqs(dg))
    w.add_tensor("nextn.pre_projection.weight", pre)
    w.add_tensor("nextn.post_projection.weight", mat(width, a_e))
    for i, swa in enumerate(dims.assistant_pattern):
        _block(w, mat, i, dims, _Block(a_e, dims.head if swa else dg, False, post, post, 0))
    _finish(w)
    return pair


def write_separate_drafter(folder: Path, dims: Dims = TINY, seed: int = 0) -> Path:
    """A plain gemma4 model of the assistant's shape (its width, blocks, heads), each block with its
    own K and V: what the assistant would be as a separate draft model with a KV cache of its own."""
    _, mat = _rng_mat(seed)
    path = folder / f"gemma4-drafter-{dims.assistant_embd}.gguf"
    w = gguf.GGUFWriter(str(path), "gemma4")
    _common(w, dims, dims.assistant_embd, dims.assistant_pattern, dims.head_global, dims.n_vocab)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_tensor("token_embd.weight", mat(dims.n_vocab, dims.assistant_embd, std=1.0))
    w.add_tensor("output_norm.weight", np.ones(dims.assistant_embd, np.float32))
    w.add_tensor("rope_freqs.weight", _rope_freqs(dims.head_global))
    for i, swa in enumerate(dims.assistant_pattern):
        hd = dims.head if swa else dims.head_global
        _block(w, mat, i, dims, _Block(dims.assistant_embd, hd, True, 1.0, 1.0, 0))
    _finish(w)
    return path
