"""llama.cpp's habits, in one table: the LLAMA_ARG_* environment variables its common/arg.cpp reads
for the options mtp-cli shares (flag over environment over default); its KV cache, loading and
sampling flags (`kv_and_sampling`); and the llama.cpp flags a command does not have, declared so
that `-ctk q8_0` is refused by name instead of being read as `-c tk`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from mtp_cli.cli.options import DEFAULTS as _D
from mtp_cli.cli.options import stack
from mtp_cli.config import (
    KV_CACHE_TYPES,
    LOAD_MODES,
    LoadConfig,
    Placement,
    parse_devices,
    parse_endpoints,
    parse_overrides,
)
from mtp_cli.errors import ConfigError

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
    "n_ubatch": "LLAMA_ARG_UBATCH",
    "cache_type_k": "LLAMA_ARG_CACHE_TYPE_K",
    "cache_type_v": "LLAMA_ARG_CACHE_TYPE_V",
    "load_mode": "LLAMA_ARG_LOAD_MODE",
    "repeat_penalty": "LLAMA_ARG_REPEAT_PENALTY",
    "repack": "LLAMA_ARG_REPACK",
    "override_tensor": "LLAMA_ARG_OVERRIDE_TENSOR",
    "device": "LLAMA_ARG_DEVICE",
    "rpc": "LLAMA_ARG_RPC",
    "n_gpu_layers_draft": "LLAMA_ARG_N_GPU_LAYERS_DRAFT",
    "n_parallel": "LLAMA_ARG_N_PARALLEL",
}

# llama.cpp flags a model-running command may lack: (spellings, takes a value); each command
# that lacks one refuses it by name (a command that has it keeps its own: settle_refusals)
UNSUPPORTED = (
    (("-ctk", "--cache-type-k"), True),
    (("-ctv", "--cache-type-v"), True),
    (("-ub", "--ubatch-size"), True),
    (("-lm", "--load-mode"), True),
    (("--no-mmap",), False),
    (("--mlock",), False),
    (("--repeat-penalty",), True),
    (("--repeat-last-n",), True),
    (("--ignore-eos",), False),
    (("--presence-penalty",), True),
    (("--frequency-penalty",), True),
    (("-l", "--logit-bias"), True),
    (("--grammar",), True),
    (("--grammar-file",), True),
    (("-j", "--json-schema"), True),
    (("-jf", "--json-schema-file"), True),
)
_REFUSAL = "unsupported_"


# llama.cpp's KV cache, loading and sampling flags, as its common/arg.cpp spells them (generate)
kv_and_sampling = stack(
    click.option(
        "-ub",
        "--ubatch-size",
        "n_ubatch",
        type=click.IntRange(min=1),
        default=None,
        help="Physical batch size [default: -b].",
    ),
    click.option(
        "-ctk",
        "--cache-type-k",
        "cache_type_k",
        type=click.Choice(KV_CACHE_TYPES),
        default=_D.cache_type_k,
        show_default=True,
        help="KV cache type for K.",
    ),
    click.option(
        "-ctv",
        "--cache-type-v",
        "cache_type_v",
        type=click.Choice(KV_CACHE_TYPES),
        default=_D.cache_type_v,
        show_default=True,
        help="KV cache type for V (quantized: needs flash attention).",
    ),
    click.option(
        "-lm",
        "--load-mode",
        "load_mode",
        type=click.Choice(LOAD_MODES),
        default=LoadConfig.load_mode,
        show_default=True,
        help="How the weights are loaded: mmap, mlock (kept in RAM), none (read in).",
    ),
    click.option("--no-mmap", "no_mmap", is_flag=True, help="Read the weights in instead of mapping them (-lm none)."),
    click.option("--mlock", is_flag=True, help="Keep the weights in RAM (-lm mmap+mlock; with --no-mmap: mlock)."),
    click.option(
        "--repeat-penalty",
        "repeat_penalty",
        type=click.FloatRange(min=0, min_open=True),
        default=_D.repeat_penalty,
        show_default=True,
        help="Penalize tokens among the last --repeat-last-n (1: off).",
    ),
    click.option(
        "--repeat-last-n",
        "repeat_last_n",
        type=click.IntRange(min=0),
        default=_D.repeat_last_n,
        show_default=True,
        help="Tokens the repeat penalty looks back over, the prompt's included (0: off).",
    ),
    click.option(
        "--ignore-eos",
        "ignore_eos",
        is_flag=True,
        default=_D.ignore_eos,
        help="Never end at an end-of-generation token.",
    ),
    click.option(
        "--presence-penalty",
        "presence_penalty",
        type=float,
        default=_D.presence_penalty,
        show_default=True,
        help="Subtracted once from a token among the last --repeat-last-n (0: off).",
    ),
    click.option(
        "--frequency-penalty",
        "frequency_penalty",
        type=float,
        default=_D.frequency_penalty,
        show_default=True,
        help="Subtracted per time a token appears among the last --repeat-last-n (0: off).",
    ),
    click.option(
        "-l",
        "--logit-bias",
        "logit_bias",
        multiple=True,
        default=(),
        metavar="TOKEN_ID(+/-)BIAS",
        help="Add BIAS to a token's logit, e.g. 15043+1 or 15043-inf (repeat the flag for more).",
    ),
    click.option(
        "--grammar", "grammar", metavar="GBNF", help="Constrain the output to this grammar (llama.cpp's GBNF)."
    ),
    click.option("--grammar-file", "grammar_file", type=click.Path(path_type=Path), help="--grammar from a file."),
    click.option(
        "-j", "--json-schema", "json_schema", metavar="SCHEMA", help="Constrain the output to this JSON schema."
    ),
    click.option(
        "-jf", "--json-schema-file", "json_schema_file", type=click.Path(path_type=Path), help="-j from a file."
    ),
)


# where weights go, for every command that loads a model (llama.cpp's spellings and variables)
repack = click.option(
    "--repack/--no-repack",
    " /-nr",
    "repack",
    default=None,
    help="Use the CPU's extra buffer types (AMX, repacked weights) or not [default: what the CPU "
    "self-check found safe; `mtp-cli doctor`].",
)
placement = stack(
    repack,
    click.option(
        "-ot",
        "--override-tensor",
        "override_tensor",
        metavar="PATTERN=BUFT,...",
        help="Put the target's tensors matching a pattern in a buffer type (CPU, CUDA0, ...).",
    ),
    click.option("-dev", "--device", "device", metavar="DEV,...", help="Devices to offload the target to (or none)."),
    click.option(
        "-otd",
        "--override-tensor-draft",
        "override_tensor_draft",
        metavar="PATTERN=BUFT,...",
        help="-ot for the draft model.",
    ),
    click.option(
        "-devd",
        "--device-draft",
        "--spec-draft-device",
        "device_draft",
        metavar="DEV,...",
        help="-dev for the draft [default: -dev].",
    ),
    click.option(
        "-ngld",
        "--n-gpu-layers-draft",
        "--gpu-layers-draft",
        "--spec-draft-ngl",
        "n_gpu_layers_draft",
        type=int,
        default=None,
        help="-ngl for the drafter [default: -ngl]; for a model's own MTP head, a value apart from -ngl "
        "loads the head as a sidecar of its own (0: it stays on this machine).",
    ),
    click.option(
        "--rpc",
        "rpc",
        metavar="HOST:PORT,...",
        help="Also use the devices of these llama.cpp rpc-servers (weights go there with -ngl).",
    ),
)


PLACEMENT_OPTIONS = (
    "repack",
    "override_tensor",
    "device",
    "override_tensor_draft",
    "device_draft",
    "rpc",
    "n_gpu_layers_draft",
)


def placement_of(opts: dict[str, Any]) -> tuple[Placement, dict[str, Any]]:
    """The Placement the placement options say, and the other options; a malformed one is a ConfigError."""
    rest = {k: v for k, v in opts.items() if k not in PLACEMENT_OPTIONS}
    return (
        Placement(
            repack=opts.get("repack"),
            override_tensor=parse_overrides(opts.get("override_tensor"), "override_tensor"),
            device=parse_devices(opts.get("device"), "device"),
            override_tensor_draft=parse_overrides(opts.get("override_tensor_draft"), "override_tensor_draft"),
            device_draft=parse_devices(opts.get("device_draft"), "device_draft"),
            rpc=parse_endpoints(opts.get("rpc"), "rpc"),
            n_gpu_layers_draft=opts.get("n_gpu_layers_draft"),
        ),
        rest,
    )


LOAD_OPTIONS = (
    "draft_model",
    "n_gpu_layers",
    "load_mode",
    "no_mmap",
    "mlock",
    "n_parallel",
    "chat_template",
    "chat_template_file",
    *PLACEMENT_OPTIONS,
)
chat_template = stack(
    click.option(
        "--chat-template",
        "chat_template",
        metavar="JINJA|chatml",
        envvar="LLAMA_ARG_CHAT_TEMPLATE",
        help="A chat template read instead of the model's own: Jinja text, or chatml.",
    ),
    click.option(
        "--chat-template-file",
        "chat_template_file",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="LLAMA_ARG_CHAT_TEMPLATE_FILE",
        help="A file holding the chat template to read instead of the model's own.",
    ),
)


def chat_template_of(opts: dict[str, Any]) -> Optional[str]:
    """The template --chat-template or --chat-template-file gives (at most one of them), or None."""
    text, path = opts.get("chat_template"), opts.get("chat_template_file")
    if text and path:
        raise click.UsageError("give one of --chat-template and --chat-template-file")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"`chat_template_file` {path}: cannot read it: {getattr(e, 'strerror', None) or e}"
            ) from None
    from mtp_cli.chat import template_text  # (llama_cpp's Jinja formatter: not for --help)

    return template_text(text) if text else None


def load_of(opts: dict[str, Any], spec_type: str = "none") -> tuple[LoadConfig, dict[str, Any]]:
    """What loading reads from the options (for `spec_type`), and the other options."""
    rest = {k: v for k, v in opts.items() if k not in LOAD_OPTIONS}
    cfg = LoadConfig(
        spec_type=spec_type,
        draft_model=str(opts["draft_model"]) if opts.get("draft_model") else None,
        n_gpu_layers=opts.get("n_gpu_layers", LoadConfig.n_gpu_layers),
        load_mode=load_mode_of(opts),
        placement=placement_of(opts)[0],
        n_parallel=opts.get("n_parallel", LoadConfig.n_parallel),
        chat_template=chat_template_of(opts),
    )
    return cfg.validated(), rest


def load_mode_of(opts: dict[str, Any]) -> str:
    """-lm, or what the old spellings --no-mmap / --mlock say (they win over -lm's default)."""
    no_mmap, mlock = opts.get("no_mmap", False), opts.get("mlock", False)
    if no_mmap or mlock:
        return {(True, False): "none", (False, True): "mmap+mlock", (True, True): "mlock"}[no_mmap, mlock]
    return str(opts.get("load_mode", "auto"))


def with_llama_env(cmd: click.Command) -> None:
    """Give `cmd`'s options llama.cpp's environment variables (shown in --help)."""
    for p in cmd.params:
        if isinstance(p, click.Option) and p.name in LLAMA_ENV and p.envvar is None:
            p.envvar, p.show_envvar = LLAMA_ENV[p.name], True


def _refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value not in (None, False):
        flag = next(o for o in param.opts if o.startswith("-"))
        raise click.UsageError(f"{flag}: llama.cpp's option is not supported by `mtp-cli {ctx.info_name}`", ctx)


def llama_compat(f: Any) -> Any:
    """Declare the llama.cpp flags on a command that runs a model (hidden; each refused by name unless
    the command has its own: settle_refusals drops those)."""
    for names, takes_value in UNSUPPORTED:
        dest = _REFUSAL + names[-1].lstrip("-").replace("-", "_")
        kind: dict[str, Any] = {"type": str} if takes_value else {"is_flag": True}
        f = click.option(*names, dest, hidden=True, expose_value=False, callback=_refuse, **kind)(f)
    return f


def settle_refusals(cmd: click.Command) -> None:
    """Drop the hidden refusals of flags `cmd` declares itself."""
    own = {o for p in cmd.params if not (p.name or "").startswith(_REFUSAL) for o in p.opts}
    cmd.params = [p for p in cmd.params if not ((p.name or "").startswith(_REFUSAL) and own & set(p.opts))]


__all__ = [
    "LLAMA_ENV",
    "UNSUPPORTED",
    "kv_and_sampling",
    "load_mode_of",
    "load_of",
    "placement",
    "placement_of",
    "repack",
    "with_llama_env",
    "llama_compat",
    "settle_refusals",
]
