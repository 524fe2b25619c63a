"""What llama.cpp (as vendored in llama-cpp-python 0.3.36) refuses or crashes on in a GGUF header.

One table: the limits as constants, and the rules that `gguf_tools.loadable` checks, each citing the
source line it mirrors (paths relative to vendor/llama.cpp). A rule's outcome says what llama.cpp
does with a file that breaks it: "refuses" (the load fails with a message), "aborts" (a GGML_ASSERT
kills the process), "SIGFPE" (a division by zero), "hangs" (an endless loop in a kernel), "crashes"
(a null pointer).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf_tools.archs import MTP_ARCHS, RECURRENT_ARCHS, ArchSet, having

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h:11
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h:12
GGML_MAX_NAME = 64  # ggml/include/ggml.h:229 (a tensor name must be shorter)
GGUF_MAX_STRING = 1 << 30  # ggml/src/gguf.cpp:20
GGUF_MAX_ARRAY = 1 << 30  # ggml/src/gguf.cpp:21
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # src/llama-model.cpp:1034-1053
EXPERT_GATING_FUNCS = (0, 1, 2, 3, 4)  # 0: the arch's default; src/llama-graph.cpp:2071-2072
TOKENIZER_MODELS = (  # src/llama-vocab.cpp:1949-2152
    "no_vocab",
    "none",
    "llama",
    "bert",
    "gpt2",
    "hybriddna",
    "whitespace",
    "t5",
    "rwkv",
    "test",
    "plamo2",
    "gemma4",
)
BPE_MODELS = ("gpt2", "hybriddna", "whitespace", "gemma4")  # need merges: src/llama-vocab.cpp:1997-2029, 2114-2139
NO_TOKENIZER_MODELS = ("no_vocab", "none")  # llama_tokenize aborts: src/llama-vocab.cpp:3422
# src/llama-model.cpp:2811-2819 (share): an assistant's sliding-window blocks read the cache of the
# target's block n_layer - 2, its global blocks that of block n_layer - 1 (sliding-window: True)
ASSISTANT_READS_FROM_END = {True: 2, False: 1}
TOKEN_TYPE_BYTE = 6  # src/llama-vocab.cpp:3196 (a byte token's text is "<0xXX>")


@dataclass(frozen=True)
class Rule:
    """One thing llama.cpp refuses or crashes on. `archs` empty: every architecture."""

    id: str
    source: str  # file:line and the check, in the vendored llama.cpp
    outcome: str  # refuses | aborts | SIGFPE | hangs | crashes
    archs: tuple[str | ArchSet, ...] = ()  # names, or sets of gguf_tools.archs read when checking
    mtp: bool = False  # only when an MTP context is created (the head is used)

    def applies(self, arch: str) -> bool:
        """Whether the rule holds for `arch` (a rule naming no arch holds for all)."""
        return not self.archs or any(arch == a if isinstance(a, str) else arch in a for a in self.archs)


def _r(id: str, source: str, outcome: str, *archs: str | ArchSet, mtp: bool = False) -> Rule:
    return Rule(id, source, outcome, archs, mtp)


_SSM = RECURRENT_ARCHS

RULES: tuple[Rule, ...] = (
    # -- the container (ggml/src/gguf.cpp, gguf_init_from_reader) --
    _r("tensor-name-length", "ggml/src/gguf.cpp:657 name length >= GGML_MAX_NAME", "refuses"),
    _r("nested-array", "ggml/src/gguf.cpp:606 arrays of arrays are an invalid type", "refuses"),
    _r("empty-key", "ggml/src/gguf.cpp:571 key is empty", "refuses"),
    _r("string-length", "ggml/src/gguf.cpp:348 string length > GGUF_MAX_STRING", "refuses"),
    _r("array-length", "ggml/src/gguf.cpp:280 array length > GGUF_MAX_ARRAY", "refuses"),
    _r("tensor-offsets", "ggml/src/gguf.cpp:792 offsets must follow one another, padded to the alignment", "refuses"),
    # -- key types (src/llama-model-loader.cpp, GGUFMeta) --
    _r("key-type", "src/llama-model-loader.cpp:165 the stored type must be exactly the one read", "refuses"),
    _r("array-type", "src/llama-model-loader.cpp:320-379 array element types", "refuses"),
    _r("layer-array-length", "src/llama-model-loader.cpp:477 a per-layer array has block_count entries", "refuses"),
    _r("required-key", "src/llama-model-loader.cpp:428 key not found in model", "refuses"),
    _r("architecture", "src/llama-model.cpp:370 unknown model architecture", "refuses"),
    # -- hyperparameters every architecture reads (src/llama-model.cpp, load_hparams) --
    _r("block-count", "src/llama-model.cpp:1328 0 < block_count <= LLAMA_MAX_LAYERS", "aborts"),
    _r("nextn-layers", "src/llama-model.cpp:1330 nextn_predict_layers <= block_count", "aborts"),
    _r("expert-count", "src/llama-model.cpp:1361 expert_count <= LLAMA_MAX_EXPERTS", "aborts"),
    _r("experts-used", "src/llama-model.cpp:1362-1373 used <= count; used > 0 with experts; none without", "aborts"),
    _r(
        "expert-groups",
        "src/llama-model.cpp:1365-1369 groups < experts, dividing them; 0 < groups used < groups",
        "aborts",
    ),
    _r("rope-scaling-type", "src/llama-model.cpp:1420 rope.scaling.type is none, linear, yarn or longrope", "aborts"),
    _r("head-groups", "ggml/src/ggml.c:3354, 5515 head_count divisible by head_count_kv", "aborts"),
    _r(
        "layer-arrays-uniform",
        "src/llama-graph.cpp:2351, ggml/src/ggml.c:4014 layer 0's counts serve every layer",
        "aborts",
    ),
    _r("rms-eps", "ggml/src/ggml-cpu/ops.cpp:4132 eps >= 0 (NaN fails)", "aborts"),
    _r(
        "expert-gating",
        "src/llama-graph.cpp:2072 expert_gating_func is 1-4 (0: the default)",
        "aborts",
        having("expert_gating"),
    ),
    _r(
        "rope-dims-exact",
        "src/llama-model.cpp:1450; src/models/qwen2.cpp:57, qwen3.cpp:57 n_rot = head dim",
        "refuses",
        having("rope_exact"),
    ),
    _r(
        "rope-dims",
        "ggml/src/ggml-cpu/ops.cpp:6355-6356, 6454 0 < n_rot <= head dim, even (0 hangs)",
        "aborts",
        having("rope_half"),
    ),
    _r(
        "rope-sections",
        "ggml/src/ggml-cpu/ops.cpp:6232, 6237 sections: 4 entries, summing to 1..head dim",
        "SIGFPE",
        "glm4moe",
        having("mrope"),
    ),
    _r(
        "head-dims-equal",
        "src/models/glm4-moe.cpp:294, qwen2.cpp:56, qwen35.cpp:137 key_length = value_length",
        "aborts",
        having("head_dims_equal"),
    ),
    # -- per architecture --
    _r("glm4moe-experts", "src/models/glm4-moe.cpp:42-43 expert_count > 0, expert_used_count > 0", "aborts", "glm4moe"),
    _r("recurrent-interval", "src/models/qwen35.cpp:21 (i + 1) % full_attention_interval", "SIGFPE", _SSM),
    _r("ssm-heads", "src/models/qwen35.cpp:439 ssm.time_step_rank divisible by ssm.group_count", "aborts", _SSM),
    _r(
        "ssm-inner",
        "src/models/delta-net-base.cpp:472, ggml/src/ggml.c:2645 ssm.inner_size = state_size x time_step_rank",
        "aborts",
        _SSM,
    ),
    _r(
        "hybrid-layers",
        "src/llama-graph.cpp:1111, src/llama-kv-cache.cpp:1492 a hybrid needs recurrent and attention blocks",
        "aborts",
        _SSM,
    ),
    _r(
        "gemma4-swa",
        "src/models/gemma4.cpp:6, 16-20; src/llama-model.cpp:2807 the sliding-window keys and a SWA block",
        "aborts",
        "gemma4",
        "gemma4-assistant",
    ),
    _r("gemma4-shared-kv", "src/llama-model.cpp:2782 block_count - shared_kv_layers >= 2", "aborts", "gemma4"),
    _r(
        "assistant-embd-out",
        "src/models/gemma4-assistant.cpp:30 embedding_length_out carries the target's width",
        "refuses",
        "gemma4-assistant",
    ),
    _r(
        "deepseek2-rope",
        "src/models/deepseek2.cpp:77 key_length_mla - rope.dimension_count >= 1",
        "aborts",
        "deepseek2",
    ),
    _r(
        "deepseek2-temperature",
        "src/llama-graph.cpp:162 temperature_scale needs temperature_length",
        "aborts",
        "deepseek2",
    ),
    _r(
        "swa-pattern",
        "src/llama-model.cpp:2807 sliding_window_pattern marks a sliding-window layer",
        "aborts",
        having("swa_pattern"),
    ),
    _r(
        "step35-rope",
        "src/models/step35.cpp:9; ops.cpp:6356 rope.dimension_count / 2 is even, > 0, at most the head dim; "
        "rope.dimension_count_swa (default: rope.dimension_count) too on sliding-window blocks",
        "aborts",
        "step35",
    ),
    _r(
        "one-head-block",
        "src/models/glm4-moe.cpp:135 (and qwen35, deepseek2) a single MTP block",
        "aborts",
        having("one_head_block"),
        mtp=True,
    ),
    _r(
        "head-block-moe",
        "src/models/glm4-moe.cpp:150 the MTP block is past leading_dense_block_count",
        "aborts",
        having("dense_lead"),
        mtp=True,
    ),
    _r(
        "head-tensors",
        "src/models/glm4-moe.cpp:147-149 (each MTP graph) nextn.eh_proj, enorm, hnorm",
        "aborts",
        MTP_ARCHS,
        mtp=True,
    ),
    # -- the vocabulary (src/llama-vocab.cpp) --
    _r("tokenizer-model", "src/llama-vocab.cpp:1944-2152 tokenizer.ggml.model is a known tokenizer", "refuses"),
    _r("token-list", "src/llama-vocab.cpp:2461-2469 tokenizer.ggml.tokens is a string array", "refuses"),
    _r("token-arrays", "src/llama-vocab.cpp:2475-2506 scores (f32/i32), token_type (i32) cover every token", "refuses"),
    _r("merges", "src/llama-vocab.cpp:1997-2029 a BPE vocabulary has tokenizer.ggml.merges", "refuses"),
    _r("duplicate-token", "src/llama-vocab.cpp:2544 GGML_ASSERT(id_to_token.size() == token_to_id.size())", "aborts"),
    _r("byte-token", "src/llama-vocab.cpp:3196-3207 byte tokens: not in bert vocabularies, text <0xXX>", "aborts"),
    _r("special-tokens", "src/llama-vocab.cpp:3442, 586, 3526 the BOS/EOS a tokenizer adds must exist", "aborts"),
    _r("no-tokenizer", "src/llama-vocab.cpp:3422 a model without a tokenizer cannot tokenize", "aborts"),
    # -- tensors against the header (src/llama-model-loader.cpp, check_tensor_dims) --
    _r("tensor-shape", "src/llama-model-loader.cpp:907-921 a tensor's shape follows from the header", "refuses"),
    _r("blocks", "src/llama-model-loader.cpp:1396 no tensor of a block past block_count", "refuses"),
)
RULE = {r.id: r for r in RULES}
