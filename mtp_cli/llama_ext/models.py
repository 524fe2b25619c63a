"""Models and contexts: loading, creating, freeing, and what a loaded model says about itself.

llama.cpp aborts the process (GGML_ASSERT) or crashes on some requests a Python caller can make by
mistake; each function here refuses those first, with a LlamaError.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from llama_cpp import llama_cpp as _C

from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.loadable import require_loadable
from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext import buffers
from mtp_cli.llama_ext.devices import device_list, has_offload_device, override_list
from mtp_cli.llama_ext.handles import Context, Model, ModelInfo

CTX_TYPE_TARGET: int = int(_C.LLAMA_CONTEXT_TYPE_DEFAULT)
CTX_TYPE_MTP: int = int(_C.LLAMA_CONTEXT_TYPE_MTP)

_HAS_N_RS_SEQ = any(f[0] == "n_rs_seq" for f in _C.llama_context_params._fields_)
_HAS_N_OUTPUTS_MAX = any(f[0] == "n_outputs_max" for f in _C.llama_context_params._fields_)


_backend_ready = False
_log_cb: Any = None  # keep the ctypes callback alive


def init_backend() -> None:
    global _backend_ready
    # ggml's abort forks a debugger for a backtrace, which can deadlock beside OpenMP's threads
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    if not _backend_ready:
        _C.llama_backend_init()
        _backend_ready = True


def quiet_logs(quiet: bool = True) -> None:
    """Silence llama.cpp's logging (quiet=True) or restore its default stderr logger."""
    global _log_cb
    if quiet:

        @_C.llama_log_callback
        def _drop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover
            return None

        _log_cb = _drop
        _C.llama_log_set(_log_cb, ctypes.c_void_p(0))
    else:
        _log_cb = None
        _C.llama_log_set(_C.llama_log_callback(), ctypes.c_void_p(0))


def load_model(
    file: str | os.PathLike[str] | GGUFFile,
    *,
    load_mtp: bool = False,
    n_gpu_layers: int = 0,
    load_mode: str = "auto",
    overrides: Sequence[tuple[str, str]] = (),
    devices: Optional[Sequence[str]] = None,
) -> Model:
    """Load a GGUF (a path, or the GGUFFile the caller already opened: its header is not read again).
    `load_mtp=True` also loads the MTP head blocks (needed for an MTP context, and for an MTP-only
    sidecar, whose heads are all it has). `load_mode`: llama.cpp's -lm (config.LOAD_MODES);
    `overrides`: its -ot, (tensor-name regex, buffer type) pairs; `devices`: its -dev (None: all).
    Which extra buffer types (AMX, repack) weights may go to is process-wide: llama_ext.buffers.
    Raises LlamaError on failure, BadFileError on a bad file."""
    init_backend()
    gf = file if isinstance(file, GGUFFile) else _opened(Path(file))
    p = gf.path
    if gf.is_mtp_sidecar and not load_mtp:
        raise LlamaError(f"{p}: an MTP-only sidecar holds nothing but heads; load it with load_mtp=True")
    require_loadable(gf.scan, p, mtp=load_mtp)  # llama.cpp aborts on what this refuses in one line
    params = _C.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else int(n_gpu_layers)
    params.load_mtp = bool(load_mtp)
    params.load_mode = int(getattr(_C, "LLAMA_LOAD_MODE_" + load_mode.upper().replace("+", "_")))  # config.LOAD_MODES
    keep_alive: list[Any] = []  # the arrays llama.cpp reads during the load
    if overrides:
        keep_alive.append(override_list(overrides))
        params.tensor_buft_overrides = ctypes.addressof(keep_alive[-1])
    if devices is not None:
        keep_alive.append(device_list(devices))
        params.devices = ctypes.addressof(keep_alive[-1])
    # MLA files (deepseek2 and its kin) abort at their first decode with weights in AMX buffers:
    # llama.cpp places k_b/v_b there, then no backend runs their batched matmul (ggml-backend.cpp:1294)
    mla = gf.arch_get("attention.kv_lora_rank") is not None
    with buffers.without(buffers.AMX) if mla else nullcontext():
        model = _C.llama_model_load_from_file(str(p).encode("utf-8"), params)
    if not model:
        raise LlamaError(f"{p}: llama.cpp failed to load the model")
    return Model(model, ModelInfo(p, bool(load_mtp), gf.layout().nextn_layers, gf.is_mtp_sidecar))


def _opened(path: Path) -> GGUFFile:
    if not path.is_file():
        raise LlamaError(f"{path}: no such file")
    return open_gguf(path)  # bounds-checked before llama.cpp sees it


def _check_kind(model: Model, ctx_type: int) -> None:
    """Refuse the context kinds llama.cpp would crash on for this model."""
    info = model.info
    if ctx_type == CTX_TYPE_MTP:
        if n_layer_nextn(model) == 0:
            raise LlamaError("an MTP context needs a model with MTP head blocks (nextn_predict_layers > 0)")
        if not info.load_mtp:
            # llama.cpp would GGML_ASSERT (abort the process) on the missing nextn tensors
            raise LlamaError(f"{info.path}: loaded without load_mtp=True; cannot create an MTP context")
    elif info.mtp_only:
        # llama.cpp would segfault building the trunk graph of a model with no trunk
        raise LlamaError(f"{info.path}: an MTP-only sidecar runs only in an MTP context (ctx_type=CTX_TYPE_MTP)")


def create_context(
    model: Model,
    *,
    n_ctx: int = 512,
    n_batch: int = 512,
    n_ubatch: Optional[int] = None,
    n_threads: Optional[int] = None,
    n_threads_batch: Optional[int] = None,
    ctx_type: int = CTX_TYPE_TARGET,
    ctx_other: Optional[Context] = None,
    n_rs_seq: int = 0,
    n_seq_max: int = 1,
    n_outputs_max: int = 0,
    embeddings: bool = False,
    pooling: Optional[int] = None,
    kv: Optional[KvOptions] = None,
) -> Context:
    """Create a context (close it, or its model, to free it). For an MTP draft context pass ctx_type=CTX_TYPE_MTP and
    ctx_other=<target context> (llama.cpp keeps ctx_other only for archs that share the
    target's memory, e.g. gemma4-assistant; for qwen35/glm4moe the MTP context has its own KV).
    `n_rs_seq` = recurrent-state snapshots per sequence for rollback (target of a hybrid arch
    such as qwen35: >= the draft length; 0 for the MTP context). Raises LlamaError on NULL."""
    init_backend()
    _check_kind(model, ctx_type)
    params = _C.llama_context_default_params()
    params.n_ctx = int(n_ctx)
    params.n_batch = min(int(n_batch), int(n_ctx)) if n_ctx else int(n_batch)
    params.n_ubatch = min(int(n_ubatch), params.n_batch) if n_ubatch else params.n_batch
    params.n_seq_max = int(n_seq_max)
    threads = n_threads if n_threads is not None else default_threads()
    params.n_threads = int(threads)
    params.n_threads_batch = int(n_threads_batch if n_threads_batch is not None else threads)
    params.ctx_type = int(ctx_type)
    params.embeddings = bool(embeddings)
    if pooling is not None:  # (llama.cpp's LLAMA_POOLING_TYPE_*: pooled embeddings per sequence)
        params.pooling_type = int(pooling)
    if kv is not None:
        _set_kv(params, kv)
    if _HAS_N_RS_SEQ:
        params.n_rs_seq = int(n_rs_seq)
    elif n_rs_seq:
        raise LlamaError("this llama.cpp build has no n_rs_seq context parameter")
    if _HAS_N_OUTPUTS_MAX and n_outputs_max:  # (at least one per sequence: llama.cpp aborts otherwise)
        params.n_outputs_max = max(int(n_outputs_max), int(n_seq_max))
    if ctx_other is not None:
        params.ctx_other = ctx_other._as_parameter_
    ctx = _C.llama_init_from_model(model, params)
    if not ctx:
        kind = "MTP" if ctx_type == CTX_TYPE_MTP else "target"
        raise LlamaError(
            f"llama.cpp failed to create the {kind} context"
            + (" (model has no MTP layers, or was loaded without load_mtp)" if kind == "MTP" else "")
        )
    return Context(ctx, model, ctx_other)


@dataclass(frozen=True)
class KvOptions:
    """The attention, KV cache and micro-batch settings every context of one generation shares
    (llama.cpp's -fa, -ctk, -ctv, -ub); None: llama.cpp's default (auto, f16 cells, n_ubatch = n_batch)."""

    type_k: Optional[str] = None  # a name of config.KV_CACHE_TYPES
    type_v: Optional[str] = None
    n_ubatch: Optional[int] = None
    flash_attn: Optional[bool] = None  # on / off; None: llama.cpp's auto


def _set_kv(params: Any, kv: KvOptions) -> None:
    for field_, name in (("type_k", kv.type_k), ("type_v", kv.type_v)):
        if name is not None:
            setattr(params, field_, int(getattr(_C, "GGML_TYPE_" + name.upper())))
    if kv.n_ubatch:
        params.n_ubatch = min(int(kv.n_ubatch), params.n_batch)
    if kv.flash_attn is not None:
        on = kv.flash_attn
        params.flash_attn_type = _C.LLAMA_FLASH_ATTN_TYPE_ENABLED if on else _C.LLAMA_FLASH_ATTN_TYPE_DISABLED


POOLING = {"mean": _C.LLAMA_POOLING_TYPE_MEAN, "cls": _C.LLAMA_POOLING_TYPE_CLS, "last": _C.LLAMA_POOLING_TYPE_LAST}


def n_embd_out(model: Model) -> int:
    """Width of an h (nextn) row: n_embd_out, falling back to n_embd."""
    n = int(_C.llama_model_n_embd_out(model))
    return n if n > 0 else int(_C.llama_model_n_embd(model))


def n_layer_nextn(model: Model) -> int:
    return int(_C.llama_model_n_layer_nextn(model))


def n_vocab(model: Model) -> int:
    return int(_C.llama_vocab_n_tokens(_C.llama_model_get_vocab(model)))


def n_rs_seq(ctx: Context) -> int:
    return int(_C.llama_n_rs_seq(ctx)) if hasattr(_C, "llama_n_rs_seq") else 0


def n_ctx(ctx: Context) -> int:
    """The context's actual size in tokens (llama.cpp may round the requested n_ctx)."""
    return int(_C.llama_n_ctx(ctx))


def n_batch(ctx: Context) -> int:
    return int(_C.llama_n_batch(ctx))


def model_has_recurrent_state(model: Model) -> bool:
    """True for recurrent (Mamba/RWKV) and hybrid (qwen35 gated delta net) models: their state
    rolls back only through n_rs_seq snapshots or a saved state, not by dropping KV cells."""
    return bool(_C.llama_model_is_recurrent(model)) or bool(_C.llama_model_is_hybrid(model))


def model_n_ctx_train(model: Model) -> int:
    return int(_C.llama_model_n_ctx_train(model))


def default_threads() -> int:
    """The thread count create_context uses when n_threads is None."""
    return max(1, min(os.cpu_count() or 1, 4))


def supports_gpu_offload() -> bool:
    """Whether layers can go to a device (a GPU, or an RPC server registered with --rpc).
    llama_supports_gpu_offload says yes for any build with the RPC backend, servers or not."""
    return bool(_C.llama_supports_gpu_offload()) and has_offload_device()


def system_info() -> str:
    """llama.cpp's build/CPU feature line (e.g. "CPU : AVX2 = 1 | ...")."""
    return bytes(_C.llama_print_system_info() or b"").decode("utf-8", "replace").strip()
