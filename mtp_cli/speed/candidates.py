"""tune's candidates: a drafting setting to measure (the head at N, the lookup, the chain, off), its
generation settings and what a rung measured of it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from mtp_cli import drafters
from mtp_cli.config import GenConfig
from mtp_cli.policy import DraftPolicy
from mtp_cli.speed.auto import LOOKUP_N_MAX
from mtp_cli.speed.runs import Setting
from mtp_cli.stats import GenStats


@dataclass
class Candidate:
    name: str  # "off", "lookup", "mtp N=3", "mtp N=3 p>=0.5", "lookup,mtp N=3"
    spec_type: str  # "none", "mtp", "lookup" or "lookup,mtp"
    n: int  # the head's N; 0 for off and the lookup alone
    p_min: float = 0.0
    predicted: Optional[float] = None  # predicted speed ratio vs plain decoding (p_min = 0 only)
    status: str = "pending"  # pending | measuring | kept | dropped | pruned | best | baseline
    rung: int = -1  # last rung it was measured in
    runs: list[float] = field(default_factory=list)  # tokens/s of each repeat in that rung
    acceptance: Optional[float] = None
    tokens_per_pass: Optional[float] = None
    ratio: Optional[float] = None  # median vs plain decoding's median in the same rung

    @property
    def tokens_per_second(self) -> Optional[float]:
        return statistics.median(self.runs) if self.runs else None

    def record(self, rung: int, runs: Sequence[float], stats: GenStats) -> None:
        """What rung `rung` measured for it."""
        self.runs, self.rung = list(runs), rung
        drafting = drafters.drafting(self.spec_type)
        self.acceptance = stats.acceptance if drafting else None
        self.tokens_per_pass = stats.tokens_per_pass if drafting else None

    @property
    def lookup(self) -> bool:
        """Whether the text lookup drafts in it (alone, or before the head)."""
        return any(m.self_sized for m in drafters.members(drafters.get(self.spec_type)))

    @property
    def off(self) -> bool:
        """Plain decoding: nothing drafts."""
        return not drafters.drafting(self.spec_type)

    @property
    def head_alone(self) -> bool:
        """The policy's drafter (tune's: the head) drafts, at N, with no self-sized lookup before it."""
        return self.n > 0 and not self.lookup

    @property
    def lookup_alone(self) -> bool:
        return self.lookup and self.n == 0

    def config(self, base: GenConfig, lookup_cap: int = LOOKUP_N_MAX) -> GenConfig:
        """Its generation settings: a lookup drafts up to its cap, the head up to N (its policy's)."""
        if not drafters.drafting(self.spec_type):
            return replace(base, spec_type="none")
        n = max(self.n, lookup_cap) if self.lookup else self.n
        return replace(base, spec_type=self.spec_type, draft_n_max=n, draft_p_min=self.p_min)

    def policy(self) -> Optional[DraftPolicy]:
        """The head's N beside a lookup that drafts longer (as `auto` runs a profile's chain)."""
        return DraftPolicy(self.n) if self.lookup and self.n else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["predicted_ratio"] = d.pop("predicted")
        return {**d, "tokens_per_second": self.tokens_per_second}


CHAIN = drafters.get("lookup,mtp").name  # the default drafting's chain


def as_setting(c: Candidate, base: GenConfig, cap: int) -> Setting:
    policy = c.policy()
    return Setting(c.name, c.config(base, cap), (lambda: policy) if policy is not None else None)


__all__ = ["Candidate", "CHAIN", "as_setting"]
