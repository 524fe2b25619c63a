"""`auto` and `adaptive` draft lengths, resolved above the runtime into a config and a DraftPolicy.

    auto = AutoDraft(rt)
    res = auto.resolve(replace(cfg, draft_mode="auto"))   # the tuned profile, else adaptive (a note says so)
    for ev in rt.generate(tokens, res.config, policy=res.policy): ...

GenConfig.draft_mode "auto": the saved profile for this model + machine (mtp only), else adaptive
with a note. "adaptive": an AdaptiveController (the one given, else one this AutoDraft keeps per
spec type, so learning carries over between generations). "fixed": the config as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from mtp_cli import drafters
from mtp_cli.config import GenConfig
from mtp_cli.errors import ConfigError
from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.adaptive import ADAPTIVE_N_MAX, AdaptiveController

DRAFT_N_MODES = ("auto", "adaptive")  # draft lengths chosen here instead of a number
NO_PROFILE_NOTE = (
    "no tuned profile for this model on this machine (run `mtp-cli tune -m MODEL`); "
    "choosing N adaptively while generating"
)


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
    policy: Optional[AdaptiveController]
    mode: str  # "fixed", "profile" or "adaptive"
    note: Optional[str] = None
    profile: Optional[profiles.Profile] = None


class AutoDraft:
    """Resolves draft lengths for one runtime; keeps its adaptive controllers and profile keys."""

    def __init__(self, rt: Runtime, config_dir: Optional[Path] = None):
        self.rt = rt
        self.config_dir = config_dir
        self.controllers: dict[str, AdaptiveController] = {}
        self._keys: dict[tuple[Optional[int], int], str] = {}

    def profile_key(self, cfg: GenConfig) -> str:
        """The key of this model's tuned profile for cfg's threads and -ngl, and where the runtime put
        the weights (RPC servers, the head's side...)."""
        k = (cfg.n_threads, cfg.n_gpu_layers)
        if k not in self._keys:
            self._keys[k] = profiles.identify(
                self.rt.file,
                self.rt.draft_file,
                n_threads=cfg.n_threads,
                n_gpu_layers=cfg.n_gpu_layers,
                placement=self.rt.placement,
            ).key
        return self._keys[k]

    def resolve(self, cfg: GenConfig, controller: Optional[AdaptiveController] = None) -> Resolved:
        """cfg's draft length chosen (a fixed one is left to the runtime's checks)."""
        mode = cfg.draft_mode
        if mode == "fixed":
            return Resolved(cfg, None, "fixed")
        spec = drafters.get(cfg.spec_type).name
        cfg = replace(cfg, spec_type=spec)
        if spec == "none":
            return Resolved(replace(cfg, draft_mode="fixed", draft_n_max=1), None, "fixed")
        res = self._from_profile(cfg) if mode == "auto" else None
        if res is None:
            ctl = controller or self.controllers.get(spec)
            if ctl is None:
                ctl = self.controllers[spec] = AdaptiveController(ADAPTIVE_N_MAX)
            note = NO_PROFILE_NOTE if mode == "auto" and spec == "mtp" else None
            res = Resolved(replace(cfg, draft_mode="adaptive", draft_n_max=ctl.n_max), ctl, "adaptive", note)
        n = res.config.draft_n_max
        if res.config.spec_type != "none" and res.config.draft_n_min > n:
            raise ConfigError(
                f"`draft_n_min` {res.config.draft_n_min} is above the draft length {mode} chose "
                f"({n}{', the tuned profile' if res.mode == 'profile' else ''}): lower it"
            )
        return res

    def _from_profile(self, cfg: GenConfig) -> Optional[Resolved]:
        prof = profiles.find(self.profile_key(cfg), self.config_dir) if cfg.spec_type == "mtp" else None
        if prof is None:
            return None
        said = (
            f"tuned profile: {prof.setting} ({prof.ratio_vs_none:.2f}x plain decoding when tuned"
            f"{', ' + prof.created[:10] if prof.created else ''})"
        )
        if prof.spec_type == "none":
            return Resolved(
                replace(cfg, spec_type="none", draft_mode="fixed", draft_n_max=1), None, "profile", said, prof
            )
        return Resolved(
            replace(cfg, draft_mode="fixed", draft_n_max=int(prof.draft_n_max), draft_p_min=float(prof.draft_p_min)),
            None,
            "profile",
            said,
            prof,
        )


__all__ = ["AutoDraft", "Resolved", "NO_PROFILE_NOTE", "parse_draft_n"]
