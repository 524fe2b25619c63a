"""Several drafters chained, as llama.cpp chains spec types (`--spec-type draft-mtp,ngram-mod`).

Each step the members are asked in turn and the first that proposes drafts; the others stay in step
(asked for nothing: a head queues id_last, a lookup takes it into its history) and every member sees
what the target kept (`accept`). The order is llama.cpp's, whatever the order given: the drafters
that read the text come before those that decode a model (common/speculative.cpp tries the n-gram
types first), so a lookup that has a long match speaks before the head spends a decode. At most
one member drafts with a model (it is the one `draft_model` and the runtime's loading are for).
A member that sizes its own drafts (the lookup) is asked up to the step's limit; the others get the
policy's N. While the policy has drafting off, the members that can sleep (a head) sleep and the
others (a lookup, which needs every token) go on: `sleeping`, until `restart`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Optional

import numpy as np

from gguf_tools.gguf_file import GGUFFile
from mtp_cli.config import GenConfig
from mtp_cli.drafters.base import ContextPlan, Drafter, Drafting, Loader, Models
from mtp_cli.drafters.joint import alone
from mtp_cli.errors import ConfigError

_CHAINS: dict[tuple[type[Drafter], ...], type[Chain]] = {}


class Chain(Drafter):
    """The base of every chain class (`chain_of` makes one per member list)."""

    members: ClassVar[tuple[type[Drafter], ...]] = ()

    def __init__(self, members: Sequence[Drafter]):  # (not Drafter.__init__: the costs are the members')
        self.parts = list(members)
        self.rows = next((m.rows for m in self.parts if m.rows is not None), None)
        ctxs = [m.n_ctx for m in self.parts if m.n_ctx is not None]
        self.n_ctx = min(ctxs) if ctxs else None
        self.proposer: Optional[Drafter] = None  # the member whose drafts the last step verified
        self.sleeping = False  # the members that can sleep do (the loop's: the policy has drafting off)
        self.remembers = any(m.remembers for m in self.parts)

    # -- the spec: the members' hooks -----------------------------------------------------------------

    @classmethod
    def _model_member(cls) -> Optional[type[Drafter]]:
        return next((m for m in cls.members if m.drafts_with_model), None)

    @classmethod
    def check_config(cls, cfg: GenConfig) -> None:
        for m in cls.members:
            m.check_config(cfg)

    @classmethod
    def check_files(cls, target: GGUFFile, draft: Optional[GGUFFile]) -> None:
        for m in cls.members:
            m.check_files(target, draft)

    @classmethod
    def target_loads_head(cls, draft: Optional[GGUFFile]) -> bool:
        return any(m.target_loads_head(draft) for m in cls.members)

    @classmethod
    def load_draft(cls, models: Models, load: Loader) -> None:
        m = cls._model_member()
        if m is not None:
            m.load_draft(models, load)

    @classmethod
    def create(cls, models: Models, plan: ContextPlan) -> Drafter:
        raise ConfigError("a chain is made of its members' drafters (Runtime.contexts)")

    # -- the protocol: every member in step, the first that proposes drafts ---------------------

    @property
    def h0(self) -> int:
        return self.parts[0].h0

    @h0.setter
    def h0(self, value: int) -> None:
        for m in self.parts:
            m.h0 = value

    @property
    def t_decode(self) -> float:
        return sum(m.t_decode for m in self.parts)

    @t_decode.setter
    def t_decode(self, value: float) -> None:
        for m in self.parts:
            m.t_decode = value

    @property
    def n_decode(self) -> int:
        return sum(m.n_decode for m in self.parts)

    @n_decode.setter
    def n_decode(self, value: int) -> None:
        for m in self.parts:
            m.n_decode = value

    def configure(self, cfg: GenConfig) -> None:
        for m in self.parts:
            m.configure(cfg)

    def _awake(self) -> list[Drafter]:
        return [m for m in self.parts if not (self.sleeping and m.can_sleep)]

    def begin(self, prompt: Sequence[int]) -> None:
        self.sleeping = False
        for m in self.parts:
            m.begin(prompt)

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool, rewound: bool) -> None:
        self.sleeping = False  # (asleep: the members that slept resume cold)
        for m in self.parts:
            m.resume(prompt, keep, asleep and m.can_sleep, rewound)

    def adopt(self, lender: Optional[Drafter], prompt: Sequence[int], keep: int) -> None:
        self.sleeping = False
        lent = lender.parts if isinstance(lender, Chain) else [None] * len(self.parts)
        for m, lm in zip(self.parts, lent):
            m.adopt(lm if type(lm) is type(m) else None, prompt, keep)

    def on_prefill(self, tokens: np.ndarray, pos0: int) -> None:
        for m in self._awake():
            m.on_prefill(tokens, pos0)

    def remember(self, tokens: np.ndarray, pos0: int) -> None:
        if self.sleeping:
            for m in self.parts:
                if m.can_sleep and m.remembers:
                    m.remember(tokens, pos0)

    def draft(self, id_last: int, pos: int, n_max: int) -> list[int]:
        return alone(self.drafting(id_last, pos, n_max))

    def drafting(self, id_last: int, pos: int, n_max: int) -> Drafting:
        return (yield from self.drafting_each(id_last, pos, lambda m: n_max))

    def drafting_each(self, id_last: int, pos: int, n_for: Callable[[Drafter], int], n_min: int = 1) -> Drafting:
        """The drafts of the first member that proposes n_min or more (each asked for n_for(member) at
        most: fewer would be discarded, so the next member is asked); the members after it are asked
        for none, so that they stay in step."""
        out: list[int] = []
        self.proposer = None
        for m in self._awake():
            n = 0 if self.proposer is not None else n_for(m)
            if m.n_max_limit is not None:
                n = min(n, m.n_max_limit)
            got = yield from m.drafting(id_last, pos, n)
            if len(got) >= max(n_min, 1) and self.proposer is None:
                out, self.proposer = got, m
        return out

    def accept(self, n_accepted: int, drafts: Sequence[int]) -> None:
        for m in self._awake():
            m.accept(n_accepted, drafts)

    def restart(self, pos: int, h: bool = True, row: int = 0) -> None:
        """The members that slept resume cold at pos (the others never stopped)."""
        for m in self.parts:
            if m.can_sleep:
                m.restart(pos, h, row)
        self.sleeping = False

    def close(self) -> None:
        """Nothing: the members are the runtime's (each also runs alone)."""


def chain_of(classes: Sequence[type[Drafter]]) -> type[Drafter]:
    """The drafter class of a chain of these spec types: one alone is itself; the members in
    llama.cpp's order (text lookups before model drafters), duplicates dropped; ConfigError for
    `none` in a chain or two members that each draft with a model."""
    members = tuple(dict.fromkeys(classes))
    if len(members) == 1:
        return members[0]
    if not all(m.drafts for m in members):
        raise ConfigError("spec type none cannot be chained with others (it drafts nothing)")
    members = tuple(sorted(members, key=lambda m: m.drafts_with_model))  # (stable: the given order otherwise)
    with_model = [m.name for m in members if m.drafts_with_model]
    if len(with_model) > 1:
        raise ConfigError(f"a chain may hold one drafter that drafts with a model, got {' and '.join(with_model)}")
    if members not in _CHAINS:
        _CHAINS[members] = _make(members)
    return _CHAINS[members]


def _make(members: tuple[type[Drafter], ...]) -> type[Chain]:
    model = next((m for m in members if m.drafts_with_model), None)
    attrs: dict[str, Any] = {
        "name": ",".join(m.name for m in members),
        "summary": "the first of " + ", ".join(m.name for m in members) + " that proposes",
        "members": members,
        "draft_file": model.draft_file if model else "none",
        "drafts_with_model": model is not None,
        "target_h": any(m.target_h for m in members),
        "can_sleep": any(m.can_sleep for m in members),  # (those that cannot go on: sleeping)
        "can_resume": all(m.can_resume for m in members),
        "self_sized": False,
        "__module__": __name__,
    }
    return type(f"Chain[{attrs['name']}]", (Chain,), attrs)


__all__ = ["Chain", "chain_of"]
