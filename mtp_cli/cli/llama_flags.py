"""llama.cpp's habits, in one table: the LLAMA_ARG_* environment variables its common/arg.cpp reads
for the options mtp-cli shares (flag over environment over default), and the llama.cpp flags
mtp-cli does not have, declared so that `-fa on` is refused by name instead of being read as `-f a`.
"""

from __future__ import annotations

from typing import Any

import click

# option destination -> the variable llama.cpp reads for it (vendor/llama.cpp/common/arg.cpp)
LLAMA_ENV = {
    "model": "LLAMA_ARG_MODEL",
    "n_threads": "LLAMA_ARG_THREADS",
    "n_ctx": "LLAMA_ARG_CTX_SIZE",
    "n_batch": "LLAMA_ARG_BATCH",
    "flash_attn": "LLAMA_ARG_FLASH_ATTN",
    "n_predict": "LLAMA_ARG_N_PREDICT",
    "n_gpu_layers": "LLAMA_ARG_N_GPU_LAYERS",
    "draft_model": "LLAMA_ARG_SPEC_DRAFT_MODEL",
    "spec_type": "LLAMA_ARG_SPEC_TYPE",
    "draft_n_max": "LLAMA_ARG_SPEC_DRAFT_N_MAX",
    "draft_n_min": "LLAMA_ARG_SPEC_DRAFT_N_MIN",
    "draft_p_min": "LLAMA_ARG_SPEC_DRAFT_P_MIN",
    "temp": "LLAMA_ARG_TEMPERATURE",
    "top_k": "LLAMA_ARG_TOP_K",
    "top_p": "LLAMA_ARG_TOP_P",
    "min_p": "LLAMA_ARG_MIN_P",
}

# llama.cpp flags mtp-cli does not support (yet): (spellings, takes a value)
UNSUPPORTED = (
    (("-ctk", "--cache-type-k"), True),
    (("-ctv", "--cache-type-v"), True),
    (("-ub", "--ubatch-size"), True),
    (("--no-mmap",), False),
    (("--mlock",), False),
    (("--repeat-penalty",), True),
    (("--ignore-eos",), False),
)


def with_llama_env(cmd: click.Command) -> None:
    """Give `cmd`'s options llama.cpp's environment variables (shown in --help)."""
    for p in cmd.params:
        if isinstance(p, click.Option) and p.name in LLAMA_ENV and p.envvar is None:
            p.envvar, p.show_envvar = LLAMA_ENV[p.name], True


def _refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value not in (None, False):
        flag = next(o for o in param.opts if o.startswith("-"))
        raise click.UsageError(f"{flag}: llama.cpp's option is not supported by mtp-cli", ctx)


def llama_compat(f: Any) -> Any:
    """Declare the llama.cpp flags mtp-cli lacks on a command that runs a model (hidden; each refused by name)."""
    for names, takes_value in UNSUPPORTED:
        dest = "unsupported_" + names[-1].lstrip("-").replace("-", "_")
        kind: dict[str, Any] = {"type": str} if takes_value else {"is_flag": True}
        f = click.option(*names, dest, hidden=True, expose_value=False, callback=_refuse, **kind)(f)
    return f


__all__ = ["LLAMA_ENV", "UNSUPPORTED", "with_llama_env", "llama_compat"]
