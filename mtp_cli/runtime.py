"""The speculative runtime: load a model (and its drafter) once, then `generate()` tokens.

    rt = Runtime.load("model.gguf", GenConfig(spec_type="mtp", draft_n_max=3))
    for ev in rt.generate(rt.tokenize("Hello"), GenConfig(spec_type="mtp", n_predict=64)):
        print(ev.text, end="")
    print(rt.stats.tokens_per_second, rt.stats.acceptance)

Speculative decoding is one generator (mlx-lm's generate.py style). Per step:

1. the drafter proposes d1..dk (k <= N; fewer near n_predict / the end of the context);
2. the target decodes [id_last, d1..dk] in ONE batch with logits on every row;
3. row i is sampled in order (greedy: argmax; otherwise llama.cpp's sampler chain, one random draw
   per emitted token) and d(i+1) is kept only while it equals that sample, so the output is
   exactly what plain decoding produces (up to ~1e-3 logit noise between batched and single-token
   kernels, which can flip a near-tie);
4. the rejected cells are removed from the target (memory_seq_rm) and the drafter rolls back.

Rollback of recurrent state (qwen35's gated delta net, any hybrid/recurrent arch): llama.cpp keeps
n_rs_seq per-token snapshots of the last decoded batch (slot s = state after the s-th token from
the end) and memory_seq_rm(p0) rolls back r = pos_max - p0 + 1 positions when 1 <= r <= n_rs_seq,
once between decodes (a second removal before the next decode is refused). Slot r is only valid if
the last batch had more than r tokens: removing a whole batch is accepted but silently restores a
stale state. The verify batch always keeps id_last, so r <= k <= N: the target gets n_rs_seq = N
exactly, and every rollback is exact. Non-recurrent archs need no snapshots (n_rs_seq = 0).
"""

from __future__ import annotations

import codecs
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Generator, Iterator, Literal, Optional, Sequence

import numpy as np

from gguf_tools.errors import BadFileError
from gguf_tools.gguf_file import open_gguf
from mtp_cli import llama_ext as lx
from mtp_cli.drafters import Drafter, ModelDrafter, MtpDrafter, NgramDrafter, NoDrafter
from mtp_cli.sampling import TokenSampler, verify_greedy, verify_sampled

LlamaError = lx.LlamaError

SpecType = Literal["none", "mtp", "draft", "ngram"]
SPEC_TYPES: tuple[str, ...] = ("none", "mtp", "draft", "ngram")
_SPEC_ALIASES = {"none": "none", "mtp": "mtp", "draft-mtp": "mtp", "draft": "draft", "draft-simple": "draft",
                 "ngram": "ngram", "ngram-simple": "ngram"}
DRAFT_N_MAX_LIMIT = 32
DRAFT_N_MODES = ("auto", "adaptive")  # --spec-draft-n-max besides a number
StopReason = Literal["eog", "n_predict", "ctx_full", "interrupted", "error"]

_now = time.perf_counter


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


class RuntimeConfigError(Exception):
    """A request the runtime refuses before running anything; the message is one line."""


class ModelFileError(RuntimeConfigError):
    """A model file is missing, not a GGUF, malformed, or llama.cpp cannot load it."""


class NoMtpHeadError(RuntimeConfigError):
    """--spec-type mtp on a model with no MTP head (and no sidecar)."""


class VocabMismatchError(RuntimeConfigError):
    """A draft model or MTP sidecar whose vocabulary differs from the target's."""


class ConfigValueError(RuntimeConfigError, ValueError):
    """A setting out of range (draft N, n_ctx, sampling parameters, prompt...)."""


# ---------------------------------------------------------------------------------------------
# configuration, events, statistics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenConfig:
    """Everything one generation needs. Defaults follow llama.cpp's where it has one."""

    n_predict: int = -1  # -n: tokens to generate; -1 = until EOG or the context is full
    n_ctx: int = 4096  # -c: 0 = the model's training context
    n_batch: int = 512  # prompt chunk size (-b)
    n_threads: Optional[int] = None  # -t: None = min(cpu count, 4)
    n_gpu_layers: int = -1  # -ngl: -1 = all (ignored by CPU builds)
    spec_type: str = "none"  # none | mtp (draft-mtp) | draft | ngram
    draft_model: Optional[str] = None  # -md: draft GGUF (draft) or MTP sidecar (mtp); read by Runtime.load only
    draft_n_max: int | str = 3  # --spec-draft-n-max; or "auto" (tuned profile) / "adaptive" (mtp_cli.adaptive)
    draft_n_min: int = 0  # --spec-draft-n-min: drafts shorter than this are discarded
    draft_p_min: float = 0.0  # --spec-draft-p-min: stop drafting below this top probability
    ngram_min: int = 2  # prompt lookup: shortest n-gram to match
    ngram_max: int = 4  # prompt lookup: longest n-gram to match
    temp: float = 0.8  # --temp: <= 0 is greedy
    top_k: int = 40  # --top-k: 0 = off
    top_p: float = 0.95  # --top-p: 1 = off
    min_p: float = 0.05  # --min-p: 0 = off
    seed: int = -1  # -s: -1 = random

    def validated(self) -> "GenConfig":
        """A normalised copy (spec-type aliases resolved); raises ConfigValueError."""
        spec = _SPEC_ALIASES.get(str(self.spec_type).lower())
        if spec is None:
            raise ConfigValueError(f"unknown spec type {self.spec_type!r}; use one of: none, mtp, draft, ngram")
        if self.n_predict < -1:
            raise ConfigValueError(f"n_predict must be >= -1, got {self.n_predict}")
        if self.n_ctx < 0:
            raise ConfigValueError(f"n_ctx must be >= 0, got {self.n_ctx}")
        if self.n_batch < 1:
            raise ConfigValueError(f"n_batch must be >= 1, got {self.n_batch}")
        if self.n_threads is not None and self.n_threads < 1:
            raise ConfigValueError(f"n_threads must be >= 1, got {self.n_threads}")
        n_mode = self.draft_n_max.strip().lower() if isinstance(self.draft_n_max, str) else None
        if n_mode is not None and n_mode not in DRAFT_N_MODES:
            raise ConfigValueError(f"--spec-draft-n-max must be a number, auto or adaptive, got {self.draft_n_max!r}")
        if spec != "none":
            if n_mode is None and not 1 <= self.draft_n_max <= DRAFT_N_MAX_LIMIT:
                raise ConfigValueError(f"--spec-draft-n-max must be in 1..{DRAFT_N_MAX_LIMIT}, got {self.draft_n_max}")
            if not 0 <= self.draft_n_min <= (DRAFT_N_MAX_LIMIT if n_mode else self.draft_n_max):
                raise ConfigValueError(f"--spec-draft-n-min must be in 0..{self.draft_n_max} (n-max), got {self.draft_n_min}")
            if not 0.0 <= self.draft_p_min <= 1.0:
                raise ConfigValueError(f"--spec-draft-p-min must be in [0, 1], got {self.draft_p_min}")
        if spec == "ngram" and not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {self.ngram_min}..{self.ngram_max}")
        if self.temp > 0.0:
            if self.top_k < 0:
                raise ConfigValueError(f"--top-k must be >= 0, got {self.top_k}")
            if not 0.0 < self.top_p <= 1.0:
                raise ConfigValueError(f"--top-p must be in (0, 1], got {self.top_p}")
            if not 0.0 <= self.min_p <= 1.0:
                raise ConfigValueError(f"--min-p must be in [0, 1], got {self.min_p}")
        return replace(self, spec_type=spec, draft_n_max=n_mode or self.draft_n_max)


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # this token's share of the UTF-8 text ("" while a multi-byte character is incomplete)
    source: Literal["draft", "target"]  # "draft": drafted and accepted; "target": the target's own token
    step: int  # verify pass that produced it (0: sampled from the prompt's logits)


@dataclass
class GenStats:
    spec_type: str = "none"
    n_max: int = 0  # effective draft length limit (after the drafter's own cap)
    n_prompt: int = 0
    n_tokens: int = 0  # generated tokens (an EOG token that ended generation is not counted)
    t_prompt: float = 0.0  # seconds: prompt decode (target + drafter catch-up) + first sample
    t_gen: float = 0.0  # seconds spent generating after the prompt, excluding time the consumer held
    t_consumer: float = 0.0  # seconds the caller spent between receiving an event and asking for the next
    n_verify: int = 0  # target decodes after the prompt (verify passes; plain decoding: one per token)
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # [i]: passes with a draft token at position i+1
    accepted_at: list[int] = field(default_factory=list)  # [i]: passes where draft position i+1 was kept
    t_target_decode: float = 0.0  # seconds inside llama_decode on the target after the prompt
    t_draft_decode: float = 0.0  # seconds inside llama_decode on the draft/MTP context after the prompt
    n_draft_decode: int = 0
    stop_reason: Optional[StopReason] = None

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def acceptance_by_pos(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def mean_accepted_per_pass(self) -> float:
        return self.n_accepted / self.n_verify if self.n_verify else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Generated tokens per verify pass (the first token comes from the prompt pass)."""
        return (self.n_tokens - 1) / self.n_verify if self.n_verify else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.t_gen if self.t_gen > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.n_prompt / self.t_prompt if self.t_prompt > 0 else 0.0

    @property
    def t_decode(self) -> float:
        return self.t_target_decode + self.t_draft_decode

    @property
    def t_overhead(self) -> float:
        """Generation seconds outside llama_decode: Python, sampling, rollback, event building."""
        return max(0.0, self.t_gen - self.t_decode)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("acceptance", "acceptance_by_pos", "mean_accepted_per_pass", "tokens_per_pass",
                  "tokens_per_second", "prompt_tokens_per_second", "t_decode", "t_overhead"):
            d[k] = getattr(self, k)
        return d


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------


def _check_file(path: str | Path, role: str) -> Any:
    """Bounds-checked header read before llama.cpp ever sees the file."""
    try:
        return open_gguf(path)
    except BadFileError as e:
        raise ModelFileError(f"{role}: {e}") from None


def _load(path: str | Path, role: str, *, load_mtp: bool, n_gpu_layers: int) -> lx.ModelPtr:
    try:
        return lx.load_model(path, load_mtp=load_mtp, n_gpu_layers=n_gpu_layers)
    except BadFileError as e:
        raise ModelFileError(f"{role}: {e}") from None
    except lx.LlamaError as e:
        raise ModelFileError(f"{role}: {e}") from None


def _check_vocab(tgt: lx.ModelPtr, dft: lx.ModelPtr, tgt_path: Path, dft_path: Path) -> None:
    """The rule llama.cpp applies to draft models (common_speculative_are_compatible): same
    vocabulary type and special tokens, sizes within 128 (padding), identical shared entries."""
    what = f"{dft_path.name} has another vocabulary than {tgt_path.name}"
    if lx.vocab_type(tgt) != lx.vocab_type(dft):
        raise VocabMismatchError(f"{what} (tokenizer type {lx.vocab_type(dft)} vs {lx.vocab_type(tgt)})")
    nt, nd = lx.n_vocab(tgt), lx.n_vocab(dft)
    if abs(nt - nd) > 128:
        raise VocabMismatchError(f"{what} (n_vocab {nd} vs {nt})")
    if lx.vocab_special(tgt) != lx.vocab_special(dft):
        raise VocabMismatchError(f"{what} (BOS/EOS {lx.vocab_special(dft)} vs {lx.vocab_special(tgt)})")
    for i in range(min(nt, nd)):
        a, b = lx.token_text(tgt, i), lx.token_text(dft, i)
        if a != b:
            raise VocabMismatchError(f"{what} (token {i}: {b!r} vs {a!r})")


@dataclass
class _Contexts:
    key: tuple  # (n_ctx, n_batch, n_threads, n_rs_seq)
    target: lx.ContextPtr
    n_ctx: int  # usable positions (the smallest of the request and every context's actual size)
    drafters: dict[str, Drafter] = field(default_factory=dict)

    def close(self) -> None:
        for d in self.drafters.values():
            d.close()  # an MTP context references the target (ctx_other): free it first
        self.drafters.clear()
        lx.free_context(self.target)


class Runtime:
    """Loads a target model and its drafter's model once; `generate()` runs any spec type the
    loaded models allow ("none" and "ngram" always; "mtp" when loaded for it; "draft" when a
    draft model was loaded). Contexts are created on first use and kept while the context
    settings (n_ctx, n_batch, threads, and N on recurrent targets) stay the same; one drafter
    per spec type is kept on the target context."""

    def __init__(self, model_path: str | Path, *, spec_type: str = "none", draft_model: Optional[str | Path] = None,
                 n_gpu_layers: int = -1, quiet: bool = True):
        spec = _SPEC_ALIASES.get(str(spec_type).lower())
        if spec is None:
            raise ConfigValueError(f"unknown spec type {spec_type!r}; use one of: none, mtp, draft, ngram")
        if quiet:
            lx.quiet_logs()
        self.model_path = Path(model_path)
        self.draft_path = Path(draft_model) if draft_model else None
        self.spec_type = spec  # what was loaded for
        self.model: Optional[lx.ModelPtr] = None
        self.head_model: Optional[lx.ModelPtr] = None  # model whose MTP head drafts (target or sidecar)
        self.draft_model: Optional[lx.ModelPtr] = None  # separate draft model (spec "draft")
        self._owned: list[lx.ModelPtr] = []
        self._ctx: Optional[_Contexts] = None
        self.stats: Optional[GenStats] = None
        self.note: Optional[str] = None  # one line about how "auto" was resolved (no tuned profile...)
        self.controller: Any = None  # the AdaptiveController of the last adaptive generation
        self._controllers: dict[str, Any] = {}  # "adaptive" keeps one per spec type across generations
        self._profile_keys: dict[tuple, str] = {}

        gf = _check_file(self.model_path, "model")
        lay = gf.layout()
        if lay.nextn_layers and "blk.0.attn_norm.weight" not in gf.tensors:
            raise RuntimeConfigError(f"{self.model_path.name} is an MTP-only sidecar: give it with -md and the trunk with -m")
        if spec == "draft" and self.draft_path is None:
            raise ConfigValueError("--spec-type draft needs a draft model: -md DRAFT.gguf")
        dgf = _check_file(self.draft_path, "draft model") if self.draft_path is not None else None

        own_head = spec == "mtp" and self.draft_path is None
        if own_head and lay.nextn_layers == 0:
            raise NoMtpHeadError(
                f"{self.model_path.name} has no MTP head (nextn_predict_layers = 0): graft one with `mtp-cli pack`, "
                "give an MTP sidecar with -md SIDECAR, or use --spec-type ngram")
        if spec == "draft" and dgf is not None and dgf.layout().nextn_layers and "blk.0.attn_norm.weight" not in dgf.tensors:
            raise RuntimeConfigError(f"-md {self.draft_path.name} is an MTP-only sidecar: use it with --spec-type mtp")
        if spec == "mtp" and dgf is not None and dgf.layout().nextn_layers == 0:
            raise NoMtpHeadError(
                f"-md {self.draft_path.name} has no MTP head (nextn_predict_layers = 0): for --spec-type mtp, -md "
                "must be an MTP sidecar (`mtp-cli extract`); a plain small model drafts with --spec-type draft")
        try:
            self.model = _load(self.model_path, "model", load_mtp=own_head, n_gpu_layers=n_gpu_layers)
            self._owned.append(self.model)
            if own_head:
                self.head_model = self.model
            elif spec in ("mtp", "draft") and self.draft_path is not None:
                dm = _load(self.draft_path, "draft model", load_mtp=spec == "mtp", n_gpu_layers=n_gpu_layers)
                self._owned.append(dm)
                _check_vocab(self.model, dm, self.model_path, self.draft_path)
                if spec == "mtp":
                    if lx.n_embd_out(dm) != lx.n_embd_out(self.model):
                        raise RuntimeConfigError(
                            f"-md {self.draft_path.name}: MTP head width {lx.n_embd_out(dm)} does not match the "
                            f"target's hidden size {lx.n_embd_out(self.model)}")
                    self.head_model = dm
                else:
                    self.draft_model = dm
        except BaseException:
            self.close()
            raise
        self.n_vocab = lx.n_vocab(self.model)
        self.recurrent = lx.model_has_recurrent_state(self.model)
        self._pieces = lx.PieceDecoder(self.model)

    @classmethod
    def load(cls, model_path: str | Path, config: GenConfig, *, quiet: bool = True) -> "Runtime":
        """Load what `config` needs (its spec type, its -md file)."""
        cfg = config.validated()
        return cls(model_path, spec_type=cfg.spec_type, draft_model=cfg.draft_model,
                   n_gpu_layers=cfg.n_gpu_layers, quiet=quiet)

    # -- helpers -----------------------------------------------------------------------------------

    def _open_model(self) -> lx.ModelPtr:
        if self.model is None:
            raise RuntimeConfigError("this runtime is closed")
        return self.model

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return lx.tokenize(self._open_model(), text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return lx.detokenize(self._open_model(), list(tokens))

    def special_texts(self) -> tuple[str, str]:
        """The BOS and EOS tokens' texts ("" when the vocabulary has none), as chat templates spell them."""
        m = self._open_model()
        return tuple(lx.token_text(m, t).decode("utf-8", "replace") if t >= 0 else "" for t in lx.vocab_special(m))

    def is_eog(self, token: int) -> bool:
        return lx.is_eog(self._open_model(), token)

    def profile_key(self, cfg: GenConfig) -> str:
        """The key of this model's tuned profile (mtp_cli.profiles) for cfg's threads and -ngl."""
        from mtp_cli import profiles

        k = (cfg.n_threads, cfg.n_gpu_layers)
        if k not in self._profile_keys:
            self._profile_keys[k] = profiles.identify(self.model_path, self.draft_path, n_threads=cfg.n_threads,
                                                      n_gpu_layers=cfg.n_gpu_layers).key
        return self._profile_keys[k]

    @property
    def n_heads(self) -> int:
        return lx.n_layer_nextn(self.head_model) if self.head_model is not None else 0

    def close_contexts(self) -> None:
        """Free the contexts (they are re-created by the next generate); the models stay loaded."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def close(self) -> None:
        self.close_contexts()
        for m in reversed(self._owned):
            lx.free_model(m)
        self._owned.clear()
        self.model = self.head_model = self.draft_model = None

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- contexts ----------------------------------------------------------------------------------

    def _contexts(self, cfg: GenConfig) -> tuple[_Contexts, Drafter]:
        """The target context for these settings (re-created when they change) and the drafter for
        cfg.spec_type on it (created once per target context)."""
        spec = cfg.spec_type
        n_ctx = cfg.n_ctx or lx.model_n_ctx_train(self.model)
        n_batch = max(cfg.n_batch, cfg.draft_n_max + 2)
        # recurrent targets keep exactly N snapshots for rollback (plain decoding: none)
        n_rs = cfg.draft_n_max if (self.recurrent and spec != "none") else 0
        key = (n_ctx, n_batch, cfg.n_threads, n_rs)
        if self._ctx is not None and self._ctx.key != key:
            self._ctx.close()
            self._ctx = None
        if self._ctx is None:
            tgt = lx.create_context(self.model, n_ctx=n_ctx, n_batch=n_batch, n_threads=cfg.n_threads, n_rs_seq=n_rs)
            self._ctx = _Contexts(key, tgt, min(n_ctx, lx.n_ctx(tgt)))
        c = self._ctx
        d = c.drafters.get(spec)
        if d is None:
            if spec == "mtp":
                d = MtpDrafter(self.head_model, c.target, n_ctx=n_ctx, n_batch=n_batch,
                               n_threads=cfg.n_threads, n_vocab_target=self.n_vocab)
            elif spec == "draft":
                d = ModelDrafter(self.draft_model, n_ctx=n_ctx, n_batch=n_batch, n_threads=cfg.n_threads,
                                 n_vocab_target=self.n_vocab)
            elif spec == "ngram":
                d = NgramDrafter()
            else:
                d = NoDrafter()
            c.drafters[spec] = d
            if spec in ("mtp", "draft"):
                c.n_ctx = min(c.n_ctx, lx.n_ctx(d.ctx))  # type: ignore[attr-defined]
        # the target computes h rows only for the MTP drafter
        lx.set_embeddings_nextn(c.target, spec == "mtp", False)
        return c, d

    # -- generation --------------------------------------------------------------------------------

    def generate(self, prompt_tokens: Sequence[int], config: GenConfig, *,
                 controller: Any = None) -> Iterator[TokenEvent]:
        """Validate, then return a generator of TokenEvents. Statistics: `self.stats` (live, final
        once the generator ends; also the generator's return value). A KeyboardInterrupt while
        generating ends the generator normally with stop_reason "interrupted"; closing the
        generator early (break) also records "interrupted".
        draft_n_max "auto" / "adaptive" (mtp_cli.adaptive.resolve): the tuned profile, else an
        AdaptiveController (`controller`, or one kept per spec type) choosing N per step;
        `self.note` says when there was no profile."""
        cfg = config.validated()
        self.note = None
        ctl = None
        if isinstance(cfg.draft_n_max, str):
            from mtp_cli.adaptive import resolve

            res = resolve(self, cfg, controller)
            cfg, ctl, self.note = res.config, res.controller, res.note
            self.controller = ctl
        spec = cfg.spec_type
        self._open_model()
        if spec == "mtp" and self.head_model is None:
            raise NoMtpHeadError(
                f"this runtime was loaded without an MTP head for {self.model_path.name}: load it with "
                "spec_type='mtp' (the model's own head, or an MTP sidecar with -md)")
        if spec == "draft" and self.draft_model is None:
            raise RuntimeConfigError("this runtime was loaded without a draft model: load it with spec_type='draft' and -md")
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ConfigValueError("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.n_vocab]
        if bad:
            raise ConfigValueError(f"prompt token {bad[0]} is outside the vocabulary (n_vocab {self.n_vocab})")
        ctxs, d = self._contexts(cfg)
        if len(prompt) > ctxs.n_ctx:
            raise ConfigValueError(f"the prompt has {len(prompt)} tokens but the context holds {ctxs.n_ctx} (-c)")
        if isinstance(d, (MtpDrafter, ModelDrafter)):
            d.p_min = cfg.draft_p_min
        if isinstance(d, NgramDrafter):
            d.ngram_min, d.ngram_max = cfg.ngram_min, cfg.ngram_max
        n_max = cfg.draft_n_max if spec != "none" else 0
        if d.n_max_limit is not None:
            n_max = min(n_max, d.n_max_limit)
        stats = GenStats(spec_type=spec, n_max=n_max, n_prompt=len(prompt),
                         drafted_at=[0] * n_max, accepted_at=[0] * n_max)
        self.stats = stats
        return self._run(prompt, cfg, ctxs.target, d, ctxs.n_ctx, stats, ctl)

    # the acceptance rule for sampled decoding (a method so tests can show a biased rule is caught)
    _verify_sampled = staticmethod(verify_sampled)

    def _run(self, prompt: list[int], cfg: GenConfig, tgt: lx.ContextPtr, drafter: Drafter, n_ctx: int,
             stats: GenStats, ctl: Any = None) -> Generator[TokenEvent, None, GenStats]:
        V = self.n_vocab
        n_max, n_min = stats.n_max, cfg.draft_n_min
        n_predict = cfg.n_predict if cfg.n_predict >= 0 else 1 << 62
        model = self.model
        sampler = TokenSampler(temp=cfg.temp, top_k=cfg.top_k, top_p=cfg.top_p, min_p=cfg.min_p, seed=cfg.seed)
        greedy = sampler.greedy
        piece = self._pieces
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        vb = lx.Batch(max(lx.n_batch(tgt), n_max + 1))
        drafted_at, accepted_at = stats.drafted_at, stats.accepted_at
        t_start = _now()
        t_consumer = 0.0
        quiet = step = 0  # (quiet: steps the adaptive controller lets the loop skip asking it about)
        try:
            if n_predict == 0:
                stats.stop_reason = "n_predict"
                return stats
            # ---- prompt -------------------------------------------------------------------------
            lx.memory_clear(tgt)
            drafter.begin(prompt)
            toks = np.asarray(prompt, dtype=np.int32)
            n_b = lx.n_batch(tgt)
            for p0 in range(0, len(toks), n_b):
                chunk = toks[p0:p0 + n_b]
                vb.clear()
                vb.add_many(chunk, p0, logits_last=p0 + n_b >= len(toks))
                lx.decode(tgt, vb)
                drafter.on_prefill(chunk, p0)
            id_last = sampler.sample(tgt, vb.n_tokens - 1, lx.logits_rows(tgt, 1, V)[0])
            n_past = len(prompt)
            stats.t_prompt = _now() - t_start
            drafter.t_decode = 0.0
            drafter.n_decode = 0
            if lx.is_eog(model, id_last):
                stats.stop_reason = "eog"
                return stats
            stats.n_tokens = 1
            t = _now()
            yield TokenEvent(id_last, utf8.decode(piece(id_last)), "target", 0)
            t_consumer += _now() - t
            emitted = 1
            step = 0
            # an adaptive controller picks N per step; while it has drafting off, a drafter that can
            # resume cold is not called at all (plain decoding's cost) and restarts when N > 0 again
            use_drafter = n_max > 0
            sleepy = ctl is not None and drafter.can_sleep
            asleep = False
            k = a = -1
            shadow = None
            if ctl is not None:
                ctl.begin(t_consumer)
            # ---- speculative steps --------------------------------------------------------------
            while True:
                if emitted >= n_predict:
                    stats.stop_reason = "n_predict"
                    break
                room = n_ctx - n_past  # free positions: id_last needs one, each draft token one more
                if room <= 0:
                    stats.stop_reason = "ctx_full"
                    break
                if ctl is not None:
                    if quiet:  # drafting is off until the controller's next decision
                        quiet -= 1
                    else:
                        n_max = ctl.step(k, a, t_consumer, step)
                        quiet = ctl.quiet
                k_max = min(n_max, room - 1, n_predict - emitted - 1)
                if sleepy and ctl.sleep and k_max <= 0:
                    asleep = True
                    drafts = []
                else:
                    if asleep:
                        drafter.restart(n_past)
                        asleep = False
                    drafts = drafter.draft(id_last, n_past, k_max) if use_drafter else []
                    if ctl is not None and ctl.shadow:  # drafted, not verified: only compared with the target's token
                        shadow, drafts = drafts, []
                if len(drafts) < n_min:  # llama.cpp: drafts shorter than n_min are discarded
                    drafts = []
                k = len(drafts)
                step += 1
                vb.clear()
                vb.add(id_last, n_past, logits=True)
                for i, dt in enumerate(drafts):
                    vb.add(dt, n_past + 1 + i, logits=True)
                t = _now()
                lx.decode(tgt, vb)
                stats.t_target_decode += _now() - t
                stats.n_verify += 1
                rows = lx.logits_rows(tgt, k + 1, V)
                a, nxt = verify_greedy(rows, drafts) if greedy else self._verify_sampled(sampler, tgt, rows, drafts)
                if k:
                    stats.n_drafted += k
                    stats.n_accepted += a
                    for i in range(k):
                        drafted_at[i] += 1
                    for i in range(a):
                        accepted_at[i] += 1
                    if a < k and not lx.memory_seq_rm(tgt, 0, n_past + a + 1, -1):
                        raise lx.LlamaError(f"the target context refused to roll back {k - a} positions "
                                            f"(n_rs_seq {lx.n_rs_seq(tgt)})")
                if shadow is not None:
                    if shadow:
                        ctl.shadow_result(shadow[0] == nxt)
                    shadow = None
                if not asleep:
                    drafter.accept(a, drafts)
                n_past += a + 1
                id_last = nxt
                # ---- emit drafts[:a] + [nxt], stopping at EOG / n_predict ---------------------------
                for j in range(a + 1):
                    tok = drafts[j] if j < a else nxt
                    if lx.is_eog(model, tok):
                        stats.stop_reason = "eog"
                        return stats
                    emitted += 1
                    stats.n_tokens = emitted
                    t = _now()
                    yield TokenEvent(tok, utf8.decode(piece(tok)), "draft" if j < a else "target", step)
                    t_consumer += _now() - t
                    if emitted >= n_predict:
                        stats.stop_reason = "n_predict"
                        return stats
            return stats
        except KeyboardInterrupt:
            stats.stop_reason = "interrupted"
            return stats
        except GeneratorExit:
            raise
        except BaseException:
            stats.stop_reason = "error"
            raise
        finally:
            if stats.stop_reason is None:
                stats.stop_reason = "interrupted"  # closed early by the consumer
            end = _now()
            if stats.t_prompt == 0.0:
                stats.t_prompt = end - t_start
            else:
                stats.t_gen = max(0.0, end - t_start - stats.t_prompt - t_consumer)
            stats.t_consumer = t_consumer
            stats.t_draft_decode = drafter.t_decode
            stats.n_draft_decode = drafter.n_decode
            if ctl is not None:
                ctl.end(step)
            sampler.close()


__all__ = [
    "GenConfig", "TokenEvent", "GenStats", "Runtime", "SPEC_TYPES", "DRAFT_N_MAX_LIMIT",
    "RuntimeConfigError", "ModelFileError", "NoMtpHeadError", "VocabMismatchError", "ConfigValueError",
    "LlamaError",
]
