"""The speculative runtime: load a model (and what its drafter drafts with) once, then `generate()` tokens.

    rt = Runtime.load("model.gguf", LoadConfig(spec_type="mtp"))  # (or Runtime.load(path, spec_type="mtp"))
    for ev in rt.generate(rt.tokenize("Hello"), GenConfig(spec_type="mtp", draft_n_max=3, n_predict=64)):
        print(ev.text, end="")
    print(rt.stats.tokens_per_second, rt.stats.acceptance)

Each model file is opened (bounds-checked) once and passed on: to llama.cpp's loader, to the
drafter's checks, and to callers (`rt.file`: chat templates, profiles). What a spec type needs
loaded, and how its drafter is built, comes from the drafter registry (mtp_cli.drafters); the
loop itself is mtp_cli.loop. A DraftPolicy (mtp_cli.policy) may choose N per step.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from gguf_tools.errors import BadFileError
from gguf_tools.gguf_file import GGUFFile
from mtp_cli import cpu_check, drafters
from mtp_cli import llama_ext as lx
from mtp_cli.attention_probe import AttentionShape
from mtp_cli.chat import Source, Templated, checked_template
from mtp_cli.config import GenConfig, LoadConfig
from mtp_cli.contexts import Contexts, ContextSettings, fa_auto_off, flash_attn_for
from mtp_cli.drafters import Drafter, Models
from mtp_cli.errors import ConfigError, LlamaError, ModelFileError, MtpError
from mtp_cli.local_head import head_sidecar
from mtp_cli.loop import VerifyLoop
from mtp_cli.memory import Held, Reuse, borrowed
from mtp_cli.model_files import check_kv, open_model_file, open_target_file
from mtp_cli.policy import DraftPolicy
from mtp_cli.sampling import verify_sampled
from mtp_cli.stats import Generation, GenStats, TokenEvent

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A generation checked and readied (Runtime.prepare): what its loop is built from."""

    prompt: list[int]
    kept: Optional[Reuse]
    cfg: GenConfig
    ctxs: Contexts
    drafter: Drafter
    policy: DraftPolicy
    stats: GenStats
    seq: int
    progress: Optional[Callable[[int, int], None]] = None  # (prompt positions in memory, of how many)


class Runtime:
    """Loads a target model, and what the drafter of `spec_type` drafts with, once; `generate()`
    runs that spec type and every one that needs nothing loaded (none, ngram). Contexts are created
    on first use and kept while the context settings (n_ctx, n_batch, threads, and N on recurrent
    targets) stay the same; one drafter per spec type is kept on the target context."""

    def __init__(self, model_path: str | os.PathLike[str], config: LoadConfig):
        """(Use `Runtime.load`: it checks the config and the machine first.)"""
        spec = drafters.get(config.spec_type)
        self.config = config
        self.model_path = Path(model_path)
        self.draft_path = Path(config.draft_model) if config.draft_model else None
        self.spec = spec  # the drafter class it was loaded for
        self._owned: list[lx.Model] = []
        self._ctx: Optional[Contexts] = None
        self._live: set[int] = set()  # sequences whose generation runs (has started and not ended)
        self.stats: Optional[GenStats] = None
        self.file = open_target_file(self.model_path)
        # (where chat templates are read: the file's own, or the one the user gave)
        given = checked_template(config.chat_template) if config.chat_template is not None else None
        self.chat_file: Source = Templated(self.file, given) if given else self.file
        if self.draft_path is None and self._head_apart(spec, config.n_gpu_layers):
            self.draft_path = head_sidecar(self.file)  # (its own model: its own -ngld)
        self.draft_file = open_model_file(self.draft_path, "draft model") if self.draft_path else None
        spec.check_files(self.file, self.draft_file)
        try:
            target = self._load(self.file, "model", spec.target_loads_head(self.draft_file))
            self.models = Models(target, self.file, draft_file=self.draft_file)
            spec.load_draft(self.models, self._load)
        except BaseException:
            self.close()
            raise
        self.n_vocab, self.n_ctx_train = lx.n_vocab(target), lx.model_n_ctx_train(target)
        self.fa_auto_off = fa_auto_off(config, self.file.arch)  # (-fa auto: off on a CPU; contexts.flash_attn_for)
        self.attn = AttentionShape.of(self.file)  # (its shape: -fa auto for several sequences on a CPU is measured)
        self.recurrent = lx.model_has_recurrent_state(target)
        self._pieces = lx.PieceDecoder(target)

    @classmethod
    def load(
        cls,
        model_path: str | os.PathLike[str],
        config: Optional[LoadConfig] = None,
        *,
        quiet: bool = True,
        **fields: Any,
    ) -> Runtime:
        """The one way to load a model: `config` (or LoadConfig's `fields`, or both: the fields
        replace the config's) checked, the CPU checked before any weight goes where llama.cpp would
        crash, RPC servers registered, then the model and what its spec type drafts with."""
        cfg = replace(config or LoadConfig(), **fields).validated()
        drafters.get(cfg.spec_type)  # (an unknown spec type is a ConfigError before anything loads)
        if quiet:
            lx.quiet_logs()
        cpu_check.ensure(cfg.placement.repack)
        lx.add_rpc_servers(cfg.placement.rpc)  # (their devices are ggml's from here on, as llama.cpp's --rpc)
        return cls(model_path, cfg)

    def _head_apart(self, spec: type[Drafter], n_gpu_layers: int) -> bool:
        """Whether the model's own head is to be placed apart from its trunk (-ngld unlike -ngl)."""
        ngld = self.config.placement.n_gpu_layers_draft
        own_head = spec.draft_file == "optional" and spec.target_loads_head(None)
        return own_head and ngld is not None and ngld != n_gpu_layers and self.file.layout().nextn_layers > 0

    def _load(self, gf: GGUFFile, role: str, load_mtp: bool) -> lx.Model:
        try:
            t0 = time.perf_counter()
            where, draft = self.config.placement, role != "model"
            overrides, devices = where.of(draft=draft)
            model = lx.load_model(
                gf,
                load_mtp=load_mtp,
                n_gpu_layers=where.gpu_layers(self.config.n_gpu_layers, draft=draft),
                load_mode=self.config.load_mode,
                overrides=overrides,
                devices=devices,
            )
            head, dt = ", with its MTP head" if load_mtp else "", time.perf_counter() - t0
            log.info("%s: loaded %s (%s, %.1f MB%s) in %.2f s", role, gf.path, gf.arch, gf.size / 1e6, head, dt)
        except (BadFileError, LlamaError) as e:
            raise ModelFileError(f"{role}: {e}") from None
        self._owned.append(model)
        return model

    # -- the loaded models ---------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._owned:
            raise MtpError("this runtime is closed")

    @property
    def model(self) -> lx.Model:
        self._require_open()
        return self.models.target

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return lx.tokenize(self.model, text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return lx.detokenize(self.model, list(tokens))

    def piece(self, token: int) -> bytes:
        """A token's text as bytes (a multi-byte character may span tokens)."""
        return self._pieces(token)

    def special_texts(self) -> tuple[str, str]:
        """The BOS and EOS tokens' texts ("" when the vocabulary has none), as chat templates spell them."""
        m = self.model
        bos, eos = (lx.token_text(m, t).decode("utf-8", "replace") if t >= 0 else "" for t in lx.vocab_special(m))
        return bos, eos

    def is_eog(self, token: int) -> bool:
        return lx.is_eog(self.model, token)

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """The model's end-of-generation tokens (a scan of the vocabulary through ctypes, 20 ms for
        49k tokens: once per model, not per generation or request)."""
        return tuple(lx.eog_tokens(self.model))

    @functools.cached_property
    def longest_token(self) -> int:
        """Bytes of the vocabulary's longest entry: a text of c characters has at least c / this
        tokens (a bound to refuse a huge prompt before tokenizing it)."""
        m = self.model
        return max(1, max(len(lx.token_text(m, t)) for t in range(self.n_vocab)))

    @property
    def n_heads(self) -> int:
        """MTP head blocks of the model that drafts (0 when it drafts with none)."""
        m = self.models.drafting if self._owned and self.spec.target_h else None
        return lx.n_layer_nextn(m) if m is not None else 0

    def can_run(self, spec: str | type[Drafter]) -> bool:
        """True if every drafter of the spec type (a name or its drafter class; a chain's members)
        needs nothing loaded, or is one this runtime loaded for."""
        cls = drafters.get(spec) if isinstance(spec, str) else spec
        loaded = drafters.members(self.spec)
        return all(m in loaded or not m.drafts_with_model for m in drafters.members(cls))

    def held(self, seq: int = 0) -> Sequence[int]:
        """The tokens sequence `seq` holds from its last generation (none when not known)."""
        h = self._ctx.held.get(seq) if self._ctx is not None else None
        return h.tokens if h is not None else ()

    def close_contexts(self) -> None:
        """Free the contexts (they are re-created by the next generate); the models stay loaded."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def close(self) -> None:
        self.close_contexts()
        for m in reversed(self._owned):
            m.close()
        self._owned.clear()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- contexts ------------------------------------------------------------------------------

    def flash_attn(self, cfg: GenConfig) -> Optional[bool]:
        """-fa as cfg's target context gets it (contexts.flash_attn_for; profiles are keyed by it)."""
        return flash_attn_for(cfg, self.fa_auto_off, self.config.n_parallel, self.attn)

    def contexts(self, cfg: GenConfig, cls: Optional[type[Drafter]] = None, seq: int = 0) -> tuple[Contexts, Drafter]:
        """The target context for cfg's settings (re-created when they change) and the drafter for
        cfg.spec_type (`cls`, when looked up) following sequence `seq` on it (one per context), configured for cfg."""
        cls = cls or drafters.get(cfg.spec_type)
        n_seq = self.config.n_parallel
        if not 0 <= seq < n_seq:
            raise ConfigError(f"sequence {seq} is not one of this runtime's {n_seq} (`n_parallel`)")
        key = ContextSettings.of(cfg, self.n_ctx_train, self.recurrent, cls.drafts, n_seq, self.flash_attn(cfg))
        if self._ctx is not None and self._ctx.key != key:
            if self._live:
                raise ConfigError(f"the context settings cannot change while sequence {min(self._live)} generates")
            self.close_contexts()
        if self._ctx is None:
            reads_draft = any(m.drafts_with_model for m in drafters.members(cls))
            check_kv(cfg, self.file, self.draft_file if reads_draft else None)
            self._ctx = Contexts.create(self.model, key)
        c = self._ctx
        d = c.drafter(cls, seq, self.models)
        d.configure(cfg)
        lx.set_embeddings_nextn(c.target, cls.target_h, False)  # the target computes h rows only for who reads them
        return c, d

    # -- generation ----------------------------------------------------------------------------

    # the acceptance rule for sampled decoding (a method so tests can show a biased rule is caught)
    _verify_sampled = staticmethod(verify_sampled)

    def generate(
        self,
        prompt_tokens: Sequence[int],
        config: GenConfig,
        *,
        policy: Optional[DraftPolicy] = None,
        reuse: bool = False,
        seq: int = 0,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> Generation:
        """Validate, then return the Generation (iterate it for TokenEvents; its `stats`, also
        `self.stats`, are live and final once it ends). A KeyboardInterrupt while generating ends it
        normally with stop_reason "interrupted"; closing it early (break) also records
        "interrupted". `policy` chooses N per step (at most its n_max, which then sizes the
        contexts); without one N is config.draft_n_max. `reuse`: the longest prefix the prompt
        shares with what the last generation left in memory is kept, only the rest decoded
        (stats.n_cached says how many; mtp_cli.memory). `seq`: the sequence (slot, 0..n_parallel-1)
        it runs in; generations in different sequences may be iterated in turn (or batched:
        mtp_cli.slots). `progress(done, total)`: the prompt's positions in memory, before its first
        chunk and after each one."""
        prep = self.prepare(prompt_tokens, config, policy=policy, reuse=reuse, seq=seq)
        prep.progress = progress
        return Generation(self._run(prep), prep.stats)

    def prepare(
        self,
        prompt_tokens: Sequence[int],
        config: GenConfig,
        *,
        policy: Optional[DraftPolicy] = None,
        reuse: bool = False,
        seq: int = 0,
    ) -> Prepared:
        """What `generate` checks and readies before its loop is built (see there)."""
        self._require_open()
        if seq in self._live:
            raise ConfigError(f"sequence {seq} is generating: end that generation first")
        cls, cfg = drafters.checked(config)
        if not cls.drafts:
            policy = None  # (plain decoding drafts nothing: a policy would learn from it wrongly)
        elif policy is not None:  # (its N is the most a step drafts, or, beside a self-sized member, the
            # most the others draft: the lookup keeps the config's own cap)
            sized = any(m.self_sized for m in drafters.members(cls))
            cfg = replace(cfg, draft_n_max=max(policy.n_max, cfg.draft_n_max) if sized else policy.n_max).validated()
        elif cfg.draft_mode != "fixed":
            raise ConfigError(
                f"`draft_mode` {cfg.draft_mode} is chosen by mtp_cli.speed.auto.AutoDraft.resolve "
                "(it gives the config and its policy)"
            )
        if not self.can_run(cls):
            raise ConfigError(
                f"this runtime was loaded without what spec type {cls.name} drafts with "
                f"({cls.summary}): load it with `spec_type`={cls.name!r}"
            )
        prompt = self._checked_prompt(prompt_tokens)
        self._check_choice(cfg)
        ctxs, d = self.contexts(cfg, cls, seq)
        if len(prompt) > ctxs.n_ctx:
            raise ConfigError(f"the prompt has {len(prompt)} tokens but the context holds {ctxs.n_ctx} (`n_ctx`)")
        n_max = cfg.draft_n_max if cls.drafts else 0
        if d.n_max_limit is not None:
            n_max = min(n_max, d.n_max_limit)
        held = ctxs.held.pop(seq, None)  # (until the new generation ends, the memory is in flux)
        kept = held.reuse(prompt, d, self.recurrent) if reuse and held is not None else None
        if reuse:  # (or a longer prefix another sequence holds, copied in)
            kept = borrowed(prompt, kept, ctxs.offers(seq), d, self.recurrent, ctxs.n_ctx) or kept
        stats = GenStats(
            spec_type=cfg.spec_type,
            n_max=n_max,
            n_prompt=len(prompt),
            n_cached=kept.keep if kept else 0,
            drafted_at=[0] * n_max,
            accepted_at=[0] * n_max,
        )
        self.stats = stats
        policy = policy if policy is not None else DraftPolicy(n_max)
        return Prepared(prompt, kept, cfg, ctxs, d, policy, stats, seq)

    def start(self, prep: Prepared) -> VerifyLoop:
        """The loop of a prepared generation, its sequence now generating (until `ended`)."""
        if prep.seq in self._live:
            raise ConfigError(f"sequence {prep.seq} is generating: end that generation first")
        eog = self.eog_tokens if prep.cfg.ignore_eos else ()
        c = prep.ctxs
        if prep.kept and prep.kept.donor is not None and not prep.kept.still_offered(c.offers(prep.seq), prep.prompt):
            prep.kept, prep.stats.n_cached = None, 0  # (its donor ran since prepare: the prompt is read whole)
        loop = VerifyLoop(
            self.model,
            c.target,
            prep.drafter,
            prep.policy,
            prep.cfg,
            c.n_ctx,
            prep.stats,
            self._pieces,
            self._verify_sampled,
            eog,
            c.costs,
            prep.seq,
        )
        loop.progress = prep.progress
        self._live.add(prep.seq)
        c.live[prep.seq] = loop.settled
        return loop

    def ended(self, prep: Prepared, loop: VerifyLoop) -> None:
        """The generation ended: its sequence is free, and what it left in memory is known unless it
        was interrupted inside a decode."""
        self._live.discard(prep.seq)
        prep.ctxs.live.pop(prep.seq, None)
        if (prep.stats.finished or loop.suspended) and loop.in_memory():
            prep.ctxs.held[prep.seq] = Held(loop.in_memory(), prep.drafter, loop.asleep)

    def _run(self, prep: Prepared) -> Generator[TokenEvent, None, GenStats]:
        """The loop, built when the generator starts (nothing is allocated for one never run)."""
        loop = self.start(prep)
        try:
            return (yield from loop.run(prep.prompt, prep.kept))
        finally:
            self.ended(prep, loop)

    def _check_choice(self, cfg: GenConfig) -> None:
        """Refuse, naming the setting, a bias on a token outside the vocabulary or a grammar llama.cpp
        cannot parse (before the generation starts: one line, not a failure mid-stream)."""
        bad = [t for t, _ in cfg.logit_bias if t >= self.n_vocab]
        if bad:
            raise ConfigError(f"`logit_bias`: token {bad[0]} is outside the vocabulary (n_vocab {self.n_vocab})")
        if cfg.grammar is not None:
            try:
                lx.Grammar(self.model, cfg.grammar).close()
            except LlamaError as e:
                raise ConfigError(f"`grammar`: {e}") from None

    def _checked_prompt(self, prompt_tokens: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ConfigError("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.n_vocab]
        if bad:
            raise ConfigError(f"prompt token {bad[0]} is outside the vocabulary (n_vocab {self.n_vocab})")
        return prompt


__all__ = ["Runtime", "Prepared", "Contexts"]
