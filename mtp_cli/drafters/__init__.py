"""The drafter registry: every spec type, found as the Drafter subclasses of this package's modules.

    cls = drafters.get("draft-mtp")          # MtpDrafter (aliases resolve)
    cfg = drafters.validated(cfg)            # canonical spec type; the drafter's and the config's checks

The runtime's loading and checks, the CLI's choices and its help all come from here; a new spec
type is one new module beside these.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace

from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import ContextPlan, Drafter, Loader, Models
from mtp_cli.drafters.chain import Chain, chain_of
from mtp_cli.errors import ConfigError


def _discover() -> dict[str, type[Drafter]]:
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")
    found: dict[str, type[Drafter]] = {}
    todo = list(Drafter.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        # (a class that declares its own spec name: a head kind inherits `mtp` and is not another)
        if "name" in vars(cls) and cls.name and cls.__module__.startswith(__name__ + "."):
            found[cls.name] = cls
    return dict(sorted(found.items(), key=lambda kv: kv[1].order))


REGISTRY = _discover()
_BY_NAME = {n: cls for cls in REGISTRY.values() for n in (cls.name, *cls.aliases)}


def get(name: str) -> type[Drafter]:
    """The drafter class of a spec type or alias, or of a comma-separated chain of them (llama.cpp's
    `draft-mtp,ngram-mod`: drafters.chain); ConfigError for an unknown one."""
    parts = [p.strip().lower() for p in str(name).split(",")]
    classes = [_BY_NAME.get(p) for p in parts]
    bad = next((p for p, c in zip(parts, classes) if c is None), None)
    if bad is not None:
        what = f" in {name!r}" if len(parts) > 1 else ""
        raise ConfigError(
            f"unknown spec type {bad!r}{what}; use one of: {', '.join(REGISTRY)}, or several comma-separated"
        )
    return chain_of([c for c in classes if c is not None])


def members(cls: type[Drafter]) -> tuple[type[Drafter], ...]:
    """A chain's drafter classes, or the class itself."""
    return cls.members if issubclass(cls, Chain) else (cls,)


def drafting(spec_type: str) -> bool:
    """Whether a spec type (a name, an alias, a chain) drafts at all (none does not)."""
    return get(spec_type).drafts


def names() -> list[str]:
    """Every spec type and alias, as a command line accepts them."""
    return list(_BY_NAME)


def checked(cfg: GenConfig) -> tuple[type[Drafter], GenConfig]:
    """The drafter class of cfg's spec type, and cfg with that spec type canonical, checked by the
    drafter and by GenConfig.validated (one look-up, one validation: the runtime's, per generation)."""
    cls = get(cfg.spec_type)
    cfg = replace(cfg, spec_type=cls.name) if cfg.spec_type != cls.name else cfg
    cls.check_config(cfg)
    return cls, cfg.validated()


def validated(cfg: GenConfig) -> GenConfig:
    """cfg with its spec type canonical, checked by its drafter and by GenConfig.validated."""
    return checked(cfg)[1]


__all__ = [
    "REGISTRY",
    "get",
    "drafting",
    "members",
    "names",
    "checked",
    "validated",
    "Chain",
    "Drafter",
    "Models",
    "ContextPlan",
    "Loader",
]
