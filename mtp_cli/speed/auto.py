"""`auto` and `adaptive` draft lengths, resolved above the runtime into a config and a DraftPolicy.

    auto = AutoDraft(rt)
    res = auto.resolve(cfg, "auto")      # the tuned profile, else adaptive (with a note saying so)
    for ev in rt.generate(tokens, res.config, policy=res.policy): ...

"auto": the saved profile for this model + machine (mtp only), else adaptive with a note.
"adaptive": an AdaptiveController (the one given, else one this AutoDraft keeps per spec type,
so learning carries over between generations).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Optional, Union

from mtp_cli import drafters
from mtp_cli.config import DRAFT_N_MAX_LIMIT, GenConfig
from mtp_cli.errors import ConfigError
from mtp_cli.runtime import Runtime
from mtp_cli.speed import profiles
from mtp_cli.speed.adaptive import ADAPTIVE_N_MAX, AdaptiveController

DraftN = Union[int, Literal["auto", "adaptive"]]
DRAFT_N_MODES = ("auto", "adaptive")  # draft lengths chosen here instead of a number
NO_PROFILE_NOTE = (
    "no tuned profile for this model on this machine (run `mtp-cli tune -m MODEL`); "
    "choosing N adaptively while generating"
)


def parse_draft_n(value: object) -> DraftN:
    """A draft length as given: a number, "auto" or "adaptive" (ConfigError otherwise)."""
    if isinstance(value, int):
        return value
    v = str(value).strip().lower()
    if v in DRAFT_N_MODES:
        return v  # type: ignore[return-value]
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"`draft_n_max` must be a number, auto or adaptive, got {value!r}") from None


@dataclass
class Resolved:
    config: GenConfig  # draft_n_max a number; spec_type may have become "none" (a profile said off)
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
        """The key of this model's tuned profile for cfg's threads and -ngl."""
        k = (cfg.n_threads, cfg.n_gpu_layers)
        if k not in self._keys:
            self._keys[k] = profiles.identify(
                self.rt.file, self.rt.draft_file, n_threads=cfg.n_threads, n_gpu_layers=cfg.n_gpu_layers
            ).key
        return self._keys[k]

    def resolve(self, cfg: GenConfig, draft_n: DraftN, controller: Optional[AdaptiveController] = None) -> Resolved:
        if isinstance(draft_n, int):
            return Resolved(drafters.validated(replace(cfg, draft_n_max=draft_n)), None, "fixed")
        cfg = drafters.validated(replace(cfg, draft_n_max=DRAFT_N_MAX_LIMIT))  # (N itself is chosen below)
        if cfg.spec_type == "none":
            return Resolved(replace(cfg, draft_n_max=1), None, "fixed")
        res = self._from_profile(cfg) if draft_n == "auto" else None
        if res is None:
            ctl = controller or self.controllers.get(cfg.spec_type)
            if ctl is None:
                ctl = self.controllers[cfg.spec_type] = AdaptiveController(ADAPTIVE_N_MAX)
            note = NO_PROFILE_NOTE if draft_n == "auto" and cfg.spec_type == "mtp" else None
            res = Resolved(replace(cfg, draft_n_max=ctl.n_max), ctl, "adaptive", note)
        n = res.config.draft_n_max
        if res.config.spec_type != "none" and res.config.draft_n_min > n:
            raise ConfigError(
                f"`draft_n_min` {res.config.draft_n_min} is above the draft length {draft_n} chose "
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
            return Resolved(replace(cfg, spec_type="none", draft_n_max=1), None, "profile", said, prof)
        return Resolved(
            replace(cfg, draft_n_max=int(prof.draft_n_max), draft_p_min=float(prof.draft_p_min)),
            None,
            "profile",
            said,
            prof,
        )


__all__ = ["AutoDraft", "Resolved", "DraftN", "NO_PROFILE_NOTE", "parse_draft_n"]
