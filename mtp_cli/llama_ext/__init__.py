"""The one wrapper around llama.cpp (llama-cpp-python 0.3.36): thin, typed functions over its C API.

Nothing else in mtp_cli imports llama_cpp's bindings; `staging` is the only module that imports the
unstable `llama_cpp.llama_cpp_ext` (nextn embeddings, nextn layer offset, ctx_other).

MTP call sequence (what llama.cpp's common_speculative_impl_draft_mtp does):

    tgt_model = load_model(path, load_mtp=True)              # a Model: trunk + head (close() frees)
    tgt = create_context(tgt_model, n_rs_seq=N)               # N >= draft length for hybrid archs
    dft = create_context(tgt_model, ctx_type=CTX_TYPE_MTP, ctx_other=tgt, n_rs_seq=0)  # tgt.close() closes it first
    #  (or a separate MTP-only sidecar: dft_model = load_model(sidecar, load_mtp=True);
    #   create_context(dft_model, ctx_type=CTX_TYPE_MTP, ...); the target model then needs no heads)
    set_embeddings_nextn(tgt, True, False)    # target: one h row per batch token
    set_embeddings_nextn(dft, True, True)     # draft: h rows for output rows only (use _ith)
    decode(tgt, prompt batch)  -> h = get_embeddings_nextn(tgt, n_prompt)
    MTP input at position p = token x_p with the target's h row of position p-1;
    the first position pairs with a zero / pending row.
"""

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.decode import (
    STATE_PARTIAL_ONLY,
    Batch,
    SeqCheckpoint,
    copy_seq_state,
    decode,
    embeddings_seq,
    logits_ith,
    logits_rows,
    memory_clear,
    memory_seq_clear,
    memory_seq_copy,
    memory_seq_rm,
    memory_seq_span,
    n_ctx_seq,
)
from mtp_cli.llama_ext.devices import Device, devices
from mtp_cli.llama_ext.grammar import JSON_GRAMMAR, Grammar, json_schema_grammar
from mtp_cli.llama_ext.handles import Context, Model, ModelInfo, Sampler
from mtp_cli.llama_ext.models import (
    CTX_TYPE_MTP,
    CTX_TYPE_TARGET,
    POOLING,
    KvOptions,
    create_context,
    default_threads,
    init_backend,
    load_model,
    model_has_recurrent_state,
    model_n_ctx_train,
    n_batch,
    n_ctx,
    n_embd_out,
    n_layer_nextn,
    n_rs_seq,
    n_vocab,
    quiet_logs,
    supports_gpu_offload,
    system_info,
)
from mtp_cli.llama_ext.rpc import add_servers as add_rpc_servers
from mtp_cli.llama_ext.rpc import supports_rpc
from mtp_cli.llama_ext.staging import (
    get_embeddings_nextn,
    get_embeddings_nextn_ith,
    reads_memory_of,
    set_embeddings_nextn,
    set_nextn_layer_offset,
)
from mtp_cli.llama_ext.vocab import (
    DEFAULT_SEED,
    PieceDecoder,
    chat_apply_template,
    chat_builtin_templates,
    detokenize,
    eog_checker,
    eog_tokens,
    is_eog,
    sampler_chain,
    sampler_sample,
    spelled,
    token_text,
    tokenize,
    vocab_special,
    vocab_type,
)

__all__ = [
    "spelled",
    "chat_apply_template",
    "chat_builtin_templates",
    "add_rpc_servers",
    "supports_rpc",
    "Grammar",
    "JSON_GRAMMAR",
    "json_schema_grammar",
    "Model",
    "Context",
    "Sampler",
    "ModelInfo",
    "Device",
    "devices",
    "LlamaError",
    "STATE_PARTIAL_ONLY",
    "Batch",
    "SeqCheckpoint",
    "decode",
    "logits_ith",
    "logits_rows",
    "memory_clear",
    "memory_seq_clear",
    "memory_seq_copy",
    "memory_seq_span",
    "copy_seq_state",
    "n_ctx_seq",
    "embeddings_seq",
    "memory_seq_rm",
    "CTX_TYPE_MTP",
    "CTX_TYPE_TARGET",
    "create_context",
    "KvOptions",
    "default_threads",
    "init_backend",
    "load_model",
    "model_has_recurrent_state",
    "model_n_ctx_train",
    "n_batch",
    "n_ctx",
    "n_embd_out",
    "POOLING",
    "n_layer_nextn",
    "n_rs_seq",
    "n_vocab",
    "quiet_logs",
    "supports_gpu_offload",
    "system_info",
    "get_embeddings_nextn",
    "reads_memory_of",
    "get_embeddings_nextn_ith",
    "set_embeddings_nextn",
    "set_nextn_layer_offset",
    "DEFAULT_SEED",
    "PieceDecoder",
    "detokenize",
    "eog_checker",
    "eog_tokens",
    "is_eog",
    "sampler_chain",
    "sampler_sample",
    "token_text",
    "tokenize",
    "vocab_special",
    "vocab_type",
]
