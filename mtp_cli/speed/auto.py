"""`auto` and `adaptive` draft lengths, resolved above the runtime into a config and a DraftPolicy.

    auto = AutoDraft(rt)
    res = auto.resolve(replace(cfg, draft_mode="auto"))   # the tuned profile, else adaptive (a note says so)
    for ev in rt.generate(tokens, res.config, policy=res.policy): ...

GenConfig.draft_mode "auto": the saved profile for this model + machine (mtp only), else adaptive
with a note. "adaptive": an AdaptiveController (the one given, else one this AutoDraft keeps per
spec type, so learning carries over between generations). "fixed": the config as it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from gguf_tools.names import ASSISTANT_ARCHS
from mtp_cli import drafters
from mtp_cli.config import GenConfig
from mtp_cli.drafters import Drafter, members
from mtp_cli.errors import ConfigError
from mtp_cli.model_files import open_model_file
from mtp_cli.policy import DraftPolicy
from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.adaptive import ADAPTIVE_N_MAX, AdaptiveController

DRAFT_N_MODES = ("auto", "adaptive")  # draft lengths chosen here instead of a number
# the most a text lookup drafts in one step under auto / adaptive: it sizes its drafts by what they
# promise against measured costs, so the cap only bounds the verify batch (and, on a recurrent
# target, the rollback snapshots llama.cpp keeps: n_rs_seq = N)
LOOKUP_N_MAX, LOOKUP_N_MAX_RECURRENT = 32, 16


def lookup_cap(recurrent: bool) -> int:
    """The most the lookup drafts in a step (a recurrent target keeps a rollback snapshot per draft)."""
    return LOOKUP_N_MAX_RECURRENT if recurrent else LOOKUP_N_MAX


NO_PROFILE_NOTE = (
    "no tuned profile for this model on this machine (run `mtp-cli tune -m MODEL`); "
    "choosing N adaptively while generating"
)
# (several slots whose probe turned flash attention on look for a profile tuned with it on)
NO_PROFILE_NOTE_FA = NO_PROFILE_NOTE.replace("-m MODEL`", "-m MODEL -fa on`: these slots run with flash attention on")


def default_spec(model: str | os.PathLike[str], draft_model: Optional[str | os.PathLike[str]] = None) -> str:
    """What drafts when no spec type is given: the text lookup (it drafts only where a match makes
    it pay), chained with the model's MTP head, or with what `draft_model` is (an MTP sidecar or
    assistant: mtp; any other model: draft), as llama.cpp infers the type from a draft model."""
    gf = open_model_file(model, "model")
    if draft_model is not None:
        df = open_model_file(draft_model, "draft model")
        head = df.layout().nextn_layers > 0 or df.arch in ASSISTANT_ARCHS
        return "lookup,mtp" if head else "lookup,draft"
    return "lookup,mtp" if gf.layout().nextn_layers > 0 else "lookup"


def parse_draft_n(value: object) -> tuple[str, Optional[int]]:
    """A draft length as given (--spec-draft-n-max): ("fixed", N), ("auto", None) or ("adaptive",
    None); ConfigError otherwise."""
    if isinstance(value, int):
        return "fixed", value
    v = str(value).strip().lower()
    if v in DRAFT_N_MODES:
        return v, None
    try:
        return "fixed", int(v)
    except ValueError:
        raise ConfigError(f"`draft_n_max` must be a number, auto or adaptive, got {value!r}") from None


@dataclass
class Resolved:
    config: GenConfig  # draft_mode fixed (or adaptive, with the policy); spec_type "none" if a profile said off
    policy: Optional[DraftPolicy]  # an AdaptiveController, or a profile's fixed N for the head of a chain
    mode: str  # "fixed", "profile" or "adaptive"
    note: Optional[str] = None
    profile: Optional[profiles.Profile] = None

    @property
    def controller(self) -> Optional[AdaptiveController]:
        """The adaptive controller choosing N, if one does."""
        return self.policy if isinstance(self.policy, AdaptiveController) else None


class AutoDraft:
    """Resolves draft lengths for one runtime; keeps its adaptive controllers and profile keys."""

    def __init__(self, rt: Runtime, config_dir: Optional[Path] = None):
        self.rt = rt
        self.config_dir = config_dir
        self.controllers: dict[str, AdaptiveController] = {}
        self._keys: dict[tuple[Optional[int], Optional[bool]], str] = {}

    def profile_key(self, cfg: GenConfig) -> str:
        """The key of this model's tuned profile for cfg's threads, and the runtime's -ngl and where it
        put the weights (RPC servers, the head's side...)."""
        k = (cfg.n_threads, self.rt.flash_attn(cfg))
        if k not in self._keys:
            self._keys[k] = profiles.identify(
                self.rt.file,
                self.rt.draft_file,
                n_threads=cfg.n_threads,
                n_gpu_layers=self.rt.config.n_gpu_layers,
                placement=self.rt.config.placement,
                flash_attn=k[1],
            ).key
        return self._keys[k]

    def _no_profile(self, cfg: GenConfig) -> str:
        """What to say without a profile: tune's own runs are keyed by the flash attention they resolve."""
        return NO_PROFILE_NOTE_FA if self.rt.flash_attn(cfg) and self.rt.fa_auto_off else NO_PROFILE_NOTE

    def resolve(self, cfg: GenConfig, controller: Optional[AdaptiveController] = None) -> Resolved:
        """cfg's draft length chosen (a fixed one is left to the runtime's checks)."""
        mode = cfg.draft_mode
        if mode == "fixed":
            return Resolved(cfg, None, "fixed")
        cls = drafters.get(cfg.spec_type)
        spec = cls.name
        cfg = replace(cfg, spec_type=spec)
        if not cls.drafts:
            return Resolved(replace(cfg, draft_mode="fixed", draft_n_max=1), None, "fixed")
        cap = self.self_sized_cap(cls)
        if all(m.self_sized for m in members(cls)):  # (a lookup sizes its own drafts: no N to choose)
            return Resolved(replace(cfg, draft_mode="fixed", draft_n_max=cap), None, "fixed")
        res = self._from_profile(cfg, cls, cap) if mode == "auto" else None
        if res is None:
            ctl = controller or self.controllers.get(spec)
            if ctl is None:
                ctl = self.controllers[spec] = AdaptiveController(ADAPTIVE_N_MAX)
            note = self._no_profile(cfg) if mode == "auto" and any(m.target_h for m in members(cls)) else None
            n_max = max(ctl.n_max, cap)
            res = Resolved(replace(cfg, draft_mode="adaptive", draft_n_max=n_max), ctl, "adaptive", note)
        n = res.policy.n_max if res.policy is not None else res.config.draft_n_max
        if drafters.drafting(res.config.spec_type) and res.config.draft_n_min > n:
            raise ConfigError(
                f"`draft_n_min` {res.config.draft_n_min} is above the draft length {mode} chose "
                f"({n}{', the tuned profile' if res.mode == 'profile' else ''}): lower it"
            )
        return res

    def self_sized_cap(self, cls: type[Drafter]) -> int:
        """The most a self-sized member (the lookup) may draft in a step here (0: it has none)."""
        if not any(m.self_sized for m in members(cls)):
            return 0
        return lookup_cap(self.rt.recurrent)

    def _from_profile(self, cfg: GenConfig, cls: type[Drafter], cap: int) -> Optional[Resolved]:
        """The tuned profile's setting of the head: N (and p-min) for it, or the chain without it
        (none, for the head alone) where tuned off (a profile of "off" or of the lookup alone); the
        lookup stays as cfg asks (it sizes its own drafts, up to its cap)."""
        head = next((m for m in members(cls) if m.target_h), None)
        prof = profiles.find(self.profile_key(cfg), self.config_dir) if head is not None else None
        if prof is None:
            return None
        said = (
            f"tuned profile: {prof.setting} ({prof.ratio_vs_none:.2f}x plain decoding when tuned"
            f"{', ' + prof.created[:10] if prof.created else ''})"
        )
        if not any(m.target_h for m in members(drafters.get(prof.spec_type))):
            rest = [m for m in members(cls) if m is not head]
            if not rest:
                return Resolved(
                    replace(cfg, spec_type="none", draft_mode="fixed", draft_n_max=1), None, "profile", said, prof
                )
            left = drafters.chain_of(rest)
            if not all(m.self_sized for m in rest):  # (an ngram left: its N is adaptive's to find)
                return self.resolve(replace(cfg, spec_type=left.name, draft_mode="adaptive"))
            return Resolved(
                replace(cfg, spec_type=left.name, draft_mode="fixed", draft_n_max=max(cap, 1)),
                None,
                "profile",
                said,
                prof,
            )
        n = int(prof.draft_n_max)
        out = replace(cfg, draft_mode="fixed", draft_n_max=max(n, cap), draft_p_min=float(prof.draft_p_min))
        return Resolved(out, DraftPolicy(n) if cap > n else None, "profile", said, prof)


__all__ = ["AutoDraft", "Resolved", "NO_PROFILE_NOTE", "LOOKUP_N_MAX", "lookup_cap", "default_spec", "parse_draft_n"]
