"""LoadConfig: what loading a model reads; GenConfig: everything one generation needs. Defaults
follow llama.cpp's where it has one.

The spec type is checked, and its aliases resolved, by the drafter registry (mtp_cli.drafters),
which also checks the settings only one drafter reads; `validated` checks the rest. How the draft
length is chosen is `draft_mode`: "fixed" (draft_n_max), or "auto" / "adaptive", which are resolved
above the runtime (mtp_cli.speed.auto) into a number and a DraftPolicy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from mtp_cli.errors import ConfigError

DRAFT_N_MAX_LIMIT = 32  # the most tokens one step may draft
# llama.cpp's -ctk / -ctv names (common/arg.cpp kv_cache_types) and -lm modes (its --load-mode)
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock")
# how N is chosen: draft_n_max; the tuned profile (else adaptive); per step from measured acceptance
DRAFT_MODES = ("fixed", "auto", "adaptive")
MAX_PARALLEL = 64  # sequences one context may hold (llama.cpp's LLAMA_MAX_SEQ is 256)
MAX_LOGPROBS = 20  # alternatives reported per token (OpenAI's top_logprobs limit)


@dataclass(frozen=True)
class Placement:
    """Where weights may go, as llama.cpp's flags say it: --repack / --no-repack (the CPU's extra
    buffer types; None: what the CPU self-check found safe), -ot and -dev for the target, -otd and
    -devd for the drafter (its devices follow the target's unless given), --rpc (other machines'
    devices), -ngld (the drafter's layers on devices; None: as -ngl; for a model's own MTP head, a
    value apart from -ngl loads the head as a sidecar of its own, so it can stay on this machine)."""

    repack: Optional[bool] = None
    override_tensor: tuple[tuple[str, str], ...] = ()  # (tensor-name regex, buffer type name)
    device: Optional[tuple[str, ...]] = None  # None: every device; ("none",): none
    override_tensor_draft: tuple[tuple[str, str], ...] = ()
    device_draft: Optional[tuple[str, ...]] = None
    rpc: tuple[str, ...] = ()  # HOST:PORT of each rpc-server
    n_gpu_layers_draft: Optional[int] = None

    def gpu_layers(self, n_gpu_layers: int, draft: bool) -> int:
        """-ngl for the target, -ngld (else -ngl) for the drafter's model."""
        return self.n_gpu_layers_draft if draft and self.n_gpu_layers_draft is not None else n_gpu_layers

    def of(self, draft: bool) -> tuple[tuple[tuple[str, str], ...], Optional[tuple[str, ...]]]:
        """(overrides, devices) for the target or the drafter's model."""
        if draft:
            return self.override_tensor_draft, self.device_draft if self.device_draft is not None else self.device
        return self.override_tensor, self.device


def parse_overrides(text: Optional[str], name: str) -> tuple[tuple[str, str], ...]:
    """llama.cpp's `<tensor name pattern>=<buffer type>,...` (-ot); the patterns must compile."""
    out = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        pattern, sep, buft = item.partition("=")
        if not sep or not pattern or not buft:
            raise ConfigError(f"`{name}` takes <tensor name pattern>=<buffer type>,..., got {item!r}")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"`{name}`: {pattern!r} is not a regular expression ({e})") from None
        out.append((pattern, buft.strip()))
    return tuple(out)


def parse_endpoints(text: Optional[str], name: str) -> tuple[str, ...]:
    """llama.cpp's --rpc `<host:port,...>`."""
    out = tuple(e.strip() for e in (text or "").split(",") if e.strip())
    bad = [e for e in out if not re.fullmatch(r"(\[[^\]]+\]|[^:\s\[\]]+):\d{1,5}", e)]
    if bad:
        raise ConfigError(f"`{name}` takes HOST:PORT,..., got {bad[0]!r}")
    return out


def parse_devices(text: Optional[str], name: str) -> Optional[tuple[str, ...]]:
    """llama.cpp's `<dev1,dev2,..>` (-dev; "none": no offloading); None when not given."""
    if text is None:
        return None
    names = tuple(d.strip() for d in text.split(",") if d.strip())
    if not names:
        raise ConfigError(f"`{name}` names no device")
    return names


def parse_logit_bias(items: Sequence[str], name: str) -> tuple[tuple[int, float], ...]:
    """llama.cpp's `TOKEN_ID(+/-)BIAS` (-l, repeated), e.g. 15043+1 or 15043-inf."""
    out = []
    for item in items:
        m = re.fullmatch(r"\s*(\d+)\s*([+-]\s*(?:inf|[0-9]*\.?[0-9]+(?:e[+-]?\d+)?))\s*", item, re.IGNORECASE)
        if not m:
            raise ConfigError(f"`{name}` takes TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf, got {item!r}")
        out.append((int(m.group(1)), float(m.group(2).replace(" ", ""))))
    return tuple(out)


@dataclass(frozen=True)
class LoadConfig:
    """What `Runtime.load` reads, once: the models a spec type drafts with, where their weights go,
    how they are mapped, and how many sequences (slots) may run on the contexts at once. A
    generation's settings (GenConfig) may change from one generation to the next; these may not."""

    spec_type: str = "none"  # what is loaded for: this spec type's drafters (and every one needing nothing loaded)
    draft_model: Optional[str] = None  # draft GGUF or MTP sidecar (-md)
    n_gpu_layers: int = -1  # -1 = all (ignored by CPU builds)
    load_mode: str = "auto"  # how llama.cpp maps the weights (LOAD_MODES)
    placement: Placement = Placement()  # where weights may go (--repack, -ot, -dev, --rpc, -ngld)
    n_parallel: int = 1  # sequences the contexts hold (llama-server's -np slots)
    chat_template: Optional[str] = None  # Jinja text read instead of the file's own (--chat-template)

    def validated(self) -> LoadConfig:
        """Self, if every value is in range (the spec type's name is the drafter registry's to check)."""
        if self.load_mode not in LOAD_MODES:
            raise ConfigError(f"`load_mode` must be one of {', '.join(LOAD_MODES)}, got {self.load_mode!r}")
        if not 1 <= self.n_parallel <= MAX_PARALLEL:
            raise ConfigError(f"`n_parallel` must be in 1..{MAX_PARALLEL}, got {self.n_parallel}")
        return self


@dataclass(frozen=True)
class GenConfig:
    n_predict: int = -1  # tokens to generate; -1 = until EOG or the context is full
    n_ctx: int = 4096  # 0 = the model's training context
    n_batch: int = 512  # prompt chunk size
    n_ubatch: Optional[int] = None  # physical batch size; None: n_batch
    flash_attn: Optional[bool] = None  # flash attention on / off; None: llama.cpp's auto
    cache_type_k: str = "f16"  # KV cache cell types (KV_CACHE_TYPES)
    cache_type_v: str = "f16"
    n_threads: Optional[int] = None  # None = min(cpu count, 4)
    spec_type: str = "none"  # a drafter's spec name or alias (mtp_cli.drafters): what this generation runs
    draft_n_max: int = 3  # most tokens drafted per step
    draft_mode: str = "fixed"  # how N is chosen (DRAFT_MODES); auto/adaptive: resolved by mtp_cli.speed.auto
    draft_n_min: int = 0  # drafts shorter than this are discarded
    draft_p_min: float = 0.0  # stop drafting below this top probability
    ngram_min: int = 2  # prompt lookup: shortest n-gram to match
    ngram_max: int = 4  # prompt lookup: longest n-gram to match
    temp: float = 0.8  # <= 0 is greedy
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.05  # 0 = off
    repeat_penalty: float = 1.0  # llama.cpp's penalties sampler: 1 = off
    repeat_last_n: int = 64  # tokens it looks back over (the prompt's included); 0 = off
    presence_penalty: float = 0.0  # the same sampler: subtracted once from a token seen there; 0 = off
    frequency_penalty: float = 0.0  # and once per time it was seen; 0 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to its logit (-inf: never)
    grammar: Optional[str] = None  # GBNF every generated text must follow (llama.cpp's --grammar)
    logprobs: Optional[int] = None  # report each token's log-probability and this many alternatives'
    post_sampling_probs: bool = False  # ...under the distribution the sampler chain draws from (llama-server's)
    ignore_eos: bool = False  # end-of-generation tokens never sampled (llama.cpp: an EOG logit bias of -inf)
    seed: int = -1  # -1 = random

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    @property
    def penalized(self) -> bool:
        on = self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return on and self.repeat_last_n > 0

    def validated(self) -> GenConfig:
        """Self, if every value is in range; raises ConfigError naming the first that is not."""
        _at_least(self.n_predict, -1, "n_predict")
        _at_least(self.n_ctx, 0, "n_ctx")
        _at_least(self.n_batch, 1, "n_batch")
        if self.n_ubatch is not None:
            _at_least(self.n_ubatch, 1, "n_ubatch")
        if self.n_threads is not None:
            _at_least(self.n_threads, 1, "n_threads")
        for name in ("cache_type_k", "cache_type_v"):
            if getattr(self, name) not in KV_CACHE_TYPES:
                raise ConfigError(f"`{name}` must be one of {', '.join(KV_CACHE_TYPES)}, got {getattr(self, name)!r}")
        if self.cache_type_v not in ("f32", "f16", "bf16") and self.flash_attn is False:
            # llama.cpp refuses the context: V is read transposed without flash attention
            raise ConfigError(f"a quantized `cache_type_v` ({self.cache_type_v}) needs `flash_attn` (on or auto)")
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise ConfigError(f"`repeat_penalty` must be above 0, got {self.repeat_penalty}")
        _at_least(self.repeat_last_n, 0, "repeat_last_n")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"`{name}` must be a number, got {getattr(self, name)}")
        for tok, bias in self.logit_bias:
            if tok < 0 or math.isnan(bias) or bias == math.inf:
                raise ConfigError(f"`logit_bias`: token {tok} with bias {bias} (a token id >= 0, a bias below +inf)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ConfigError(f"`logprobs` must be in 0..{MAX_LOGPROBS}, got {self.logprobs}")
        if not isinstance(self.draft_n_max, int) or isinstance(self.draft_n_max, bool):
            raise ConfigError(
                f"`draft_n_max` must be a number (auto and adaptive are a `draft_mode`, resolved by "
                f"mtp_cli.speed.auto), got {self.draft_n_max!r}"
            )
        if self.draft_mode not in DRAFT_MODES:
            raise ConfigError(f"`draft_mode` must be one of {', '.join(DRAFT_MODES)}, got {self.draft_mode!r}")
        if self.spec_type != "none":
            if not 1 <= self.draft_n_max <= DRAFT_N_MAX_LIMIT:
                raise ConfigError(f"`draft_n_max` must be in 1..{DRAFT_N_MAX_LIMIT}, got {self.draft_n_max!r}")
            if not 0 <= self.draft_n_min <= self.draft_n_max:
                raise ConfigError(
                    f"`draft_n_min` must be in 0..{self.draft_n_max} (`draft_n_max`), got {self.draft_n_min}"
                )
            _in_unit(self.draft_p_min, "draft_p_min")
        if not self.greedy:
            _at_least(self.top_k, 0, "top_k")
            if not 0.0 < self.top_p <= 1.0:
                raise ConfigError(f"`top_p` must be in (0, 1], got {self.top_p}")
            _in_unit(self.min_p, "min_p")
        return self


def _at_least(value: int, low: int, name: str) -> None:
    if value < low:
        raise ConfigError(f"`{name}` must be >= {low}, got {value}")


def _in_unit(value: float, name: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"`{name}` must be in [0, 1], got {value}")


__all__ = [
    "GenConfig",
    "LoadConfig",
    "Placement",
    "parse_devices",
    "parse_overrides",
    "parse_logit_bias",
    "parse_endpoints",
    "DRAFT_N_MAX_LIMIT",
    "DRAFT_MODES",
    "KV_CACHE_TYPES",
    "LOAD_MODES",
    "MAX_PARALLEL",
]
