"""The container and the key types: what gguf.cpp and llama.cpp's GGUFMeta refuse before any
hyperparameter is looked at (gguf_tools.limits cites each)."""

from __future__ import annotations

from collections.abc import Iterator

from gguf import GGUFValueType as T

from gguf_tools.archs import record
from gguf_tools.limits import GGML_MAX_NAME, GGUF_MAX_ARRAY, GGUF_MAX_STRING, LLAMA_MAX_LAYERS
from gguf_tools.loadable.header import Header, Problem, check, problem
from gguf_tools.prescan import ArrayValue

U32, F32, BOOL, STR, I32 = T.UINT32, T.FLOAT32, T.BOOL, T.STRING, T.INT32

GENERAL_TYPES = {
    "general.architecture": STR,
    "general.name": STR,
    "general.file_type": U32,
    "tokenizer.ggml.model": STR,
    "tokenizer.ggml.pre": STR,
    "tokenizer.ggml.token_type_count": U32,
    **{
        f"tokenizer.ggml.{k}": BOOL
        for k in ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces")
    },
    **{
        f"tokenizer.ggml.{k}_token_id": U32
        for k in (
            "bos",
            "eos",
            "eot",
            "eom",
            "unknown",
            "seperator",
            "padding",
            "mask",
            "fim_pre",
            "fim_suf",
            "fim_mid",
            "fim_pad",
            "fim_rep",
            "fim_sep",
            "prefix",
            "suffix",
            "middle",
        )
    },
}
ARCH_TYPES = {  # `{arch}.name`: the type llama.cpp reads (src/llama-model.cpp load_hparams, src/models/*.cpp)
    **dict.fromkeys(
        (
            "context_length",
            "embedding_length",
            "embedding_length_out",
            "block_count",
            "nextn_predict_layers",
            "expert_count",
            "expert_group_count",
            "expert_group_used_count",
            "pooling_type",
            "vocab_size",
            "attention.key_length",
            "attention.value_length",
            "rope.dimension_count",
            "attention.key_length_swa",
            "attention.value_length_swa",
            "rope.dimension_count_swa",
            "rope.scaling.original_context_length",
            "leading_dense_block_count",
            "expert_shared_count",
            "expert_gating_func",
            "expert_shared_feed_forward_length",
            "full_attention_interval",
            "ssm.conv_kernel",
            "ssm.inner_size",
            "ssm.state_size",
            "ssm.time_step_rank",
            "ssm.group_count",
            "attention.q_lora_rank",
            "attention.kv_lora_rank",
            "attention.key_length_mla",
            "attention.value_length_mla",
            "attention.sliding_window",
            "attention.temperature_length",
            "attention.shared_kv_layers",
            "embedding_length_per_layer_input",
        ),
        U32,
    ),
    **dict.fromkeys(
        (
            "rope.freq_base",
            "rope.scaling.factor",
            "rope.scale_linear",
            "rope.scaling.attn_factor",
            "rope.scaling.alpha",
            "attention.layer_norm_rms_epsilon",
            "attention.layer_norm_epsilon",
            "expert_weights_scale",
            "attention.temperature_scale",
            "rope.freq_base_swa",
            "attention.value_scale",
            "final_logit_softcapping",
            "attn_logit_softcapping",
        ),
        F32,
    ),
    **dict.fromkeys(("attention.causal", "rope.scaling.finetuned", "expert_weights_norm"), BOOL),
    "rope.scaling.type": STR,
}
# read with get_key_or_arr: a scalar of the type above, or an array with one entry per block
LAYER_KEYS = (
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "expert_used_count",
    "expert_feed_forward_length",
)
LAYER_ELEMS = {T.UINT32, T.INT32, T.BOOL}  # src/llama-model-loader.cpp:366-379 (std::array targets)
FLAG_ARRAYS = (
    "attention.sliding_window_pattern",
    "attention.recurrent_layers",
    "swiglu_clamp_exp",
    "swiglu_clamp_shexp",
)
REQUIRED = ("context_length", "embedding_length", "block_count")  # every arch's load_hparams (required = true)
RMS_EPS = "attention.layer_norm_rms_epsilon"  # for the archs whose record says rms; the rest: ArchRecord.required


def required_keys(arch: str) -> tuple[str, ...]:
    """The `{arch}.name` keys llama.cpp's loader requires of `arch`."""
    rec = record(arch)
    return REQUIRED + ((RMS_EPS,) if rec and rec.rms else ()) + (rec.required if rec else ())


@check
def container(h: Header) -> Iterator[Problem]:
    for name in h.tensors:
        if len(name.encode()) >= GGML_MAX_NAME:
            yield problem(
                "tensor-name-length",
                name,
                f"tensor name {name[:24]!r}... is {len(name.encode())} bytes long, the limit is {GGML_MAX_NAME - 1}",
            )
    for k, v in h.values.items():
        if k == "":
            yield problem("empty-key", k, "a key is empty")
        if isinstance(v, ArrayValue):
            if v.etype == T.ARRAY:
                yield problem("nested-array", k, f"{k} is an array of arrays")
            elif v.count > GGUF_MAX_ARRAY:
                yield problem("array-length", k, f"{k} has {v.count} items, the limit is {GGUF_MAX_ARRAY}")
        elif isinstance(v, str) and len(v.encode()) > GGUF_MAX_STRING:
            yield problem("string-length", k, f"{k} is longer than {GGUF_MAX_STRING} bytes")
    yield from _offsets(h)


def _offsets(h: Header) -> Iterator[Problem]:
    start, align = h.scan.data_start, h.scan.alignment
    pos = start
    for t in h.scan.tensors:
        if t.offset != pos:
            what = f"tensor {t.name!r} is at data offset {t.offset - start}, llama.cpp expects {pos - start}"
            yield problem("tensor-offsets", t.name, what)
            return
        pos += -(-t.n_bytes // align) * align


def _type_name(k: str, h: Header) -> str:
    t = h.types[k]
    v = h.values[k]
    return f"an array of {v.etype.name.lower()}" if isinstance(v, ArrayValue) else t.name.lower()


@check
def key_types(h: Header) -> Iterator[Problem]:
    expect = {**GENERAL_TYPES, **{h.key(k): t for k, t in ARCH_TYPES.items()}}
    layer = {h.key(k) for k in LAYER_KEYS}
    flags = {h.key(f) for f in FLAG_ARRAYS}
    for k, vt in h.types.items():
        if k in layer:
            yield from _layer_key(h, k)
        elif k in expect and vt != expect[k]:
            yield problem("key-type", k, f"{k} is {_type_name(k, h)}, llama.cpp reads a {expect[k].name.lower()}")
        elif k in flags and isinstance(h.values[k], ArrayValue):
            yield from _flag_array(h, k)


def _layer_key(h: Header, k: str) -> Iterator[Problem]:
    v = h.values[k]
    if not isinstance(v, ArrayValue):
        if h.types[k] != U32:
            yield problem("key-type", k, f"{k} is {_type_name(k, h)}, llama.cpp reads a uint32 (or one per layer)")
        return
    if v.etype not in LAYER_ELEMS:
        yield problem("array-type", k, f"{k} is {_type_name(k, h)}, llama.cpp reads uint32, int32 or bool items")
    elif v.count != h.n_layers:
        yield problem("layer-array-length", k, f"{k} has {v.count} entries for {h.n_layers} blocks")


def _flag_array(h: Header, k: str) -> Iterator[Problem]:
    v = h.values[k]
    if v.etype not in LAYER_ELEMS and not (k.endswith("swiglu_clamp_exp") or k.endswith("swiglu_clamp_shexp")):
        yield problem("array-type", k, f"{k} is {_type_name(k, h)}, llama.cpp reads uint32, int32 or bool items")
    elif v.count > LLAMA_MAX_LAYERS:
        yield problem("layer-array-length", k, f"{k} has {v.count} entries, the limit is {LLAMA_MAX_LAYERS}")


@check
def required(h: Header) -> Iterator[Problem]:
    arch_v = h.values.get("general.architecture")
    if not isinstance(arch_v, str) or not arch_v:
        yield problem("architecture", "general.architecture", "general.architecture is missing")
        return
    for name in required_keys(h.arch):
        if not h.has(name):
            yield problem("required-key", h.key(name), f"{h.key(name)} is missing")
