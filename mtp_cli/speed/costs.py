"""The cost model (ARCHITECTURE §6): what one speculative step costs relative to a plain token, and when MTP pays.

T = one plain token's llama_decode; v(N) = a target decode of N+1 tokens with logits on every row
(and the MTP h rows on), relative to T; c(m) = a step's first head decode, of m rows (it also
carries the a tokens accepted by the previous step: m = a + 1, and several rows cost more than one
on a CPU); c = a later one-row head decode of the step; o(N) = Python outside llama_decode per step.
One MTP step at N costs

    cost(N) = v(N) + c(E) + (N-1) c + o(N)      (c(E): the first decode, at the mean m = E),

and MTP's speed ratio is E(N) (1 + o_plain) / cost(N), E(N) = 1 + sum_{i<N} A_i,
A_i = P(the first i+1 drafts are accepted) (GenStats.acceptance_by_pos); with i.i.d. per-token
acceptance alpha, E(N) = sum_{i=0..N} alpha^i, and `break_even_alpha` solves for the alpha at
which MTP only ties with plain decoding. mtp_cli.speed.probe measures T, v and c.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from mtp_cli.stats import GenStats


@dataclass
class CostModel:
    """Costs relative to T (one plain token's llama_decode); see the module docstring."""

    t_ms: float  # T
    verify: list[float]  # v(N), N = 0..n_max (v(0): one token with MTP's h rows on)
    draft: float  # c: a step's later one-row head decode
    draft_rows: list[float] = field(default_factory=list)  # c(m), m = 1.. rows in a step's first head decode
    overhead_plain: float = 0.0  # per plain token, outside llama_decode
    overhead: dict[int, float] = field(default_factory=dict)  # per MTP step at N, outside llama_decode

    @property
    def n_max(self) -> int:
        return len(self.verify) - 1

    def overhead_at(self, n: int) -> float:
        """o(N): measured, else interpolated linearly between measured N (flat beyond them); o_plain if none."""
        if n in self.overhead:
            return self.overhead[n]
        if not self.overhead:
            return self.overhead_plain
        ks = sorted(self.overhead)
        if n <= ks[0]:
            return self.overhead[ks[0]]
        if n >= ks[-1]:
            return self.overhead[ks[-1]]
        lo = max(k for k in ks if k < n)
        hi = min(k for k in ks if k > n)
        return self.overhead[lo] + (self.overhead[hi] - self.overhead[lo]) * (n - lo) / (hi - lo)

    def rows_cost(self, m: float) -> float:
        """c(m): one head decode of m rows (interpolated; c * m past the measured range)."""
        rows = self.draft_rows or [self.draft]
        if m <= 1:
            return rows[0]
        i = int(m)
        if i >= len(rows):
            return rows[-1] + (m - len(rows)) * self.draft
        return rows[i - 1] + (rows[i] - rows[i - 1]) * (m - i)

    def draft_cost(self, n: int, tokens: float = 1.0) -> float:
        """The head's decodes in one step at N when steps emit `tokens` on average: c(E) + (N-1) c."""
        return self.rows_cost(tokens) + (n - 1) * self.draft

    def step_cost(self, n: int, tokens: float = 1.0) -> float:
        """One MTP step at N, relative to T: v(N) + c(E) + (N-1) c + o(N)."""
        return self.verify[n] + self.draft_cost(n, tokens) + self.overhead_at(n)

    @property
    def plain_cost(self) -> float:
        return 1.0 + self.overhead_plain

    def break_even_tokens(self, n: int) -> float:
        """Tokens per verify step MTP needs at N to tie with plain decoding (the E with
        E (1 + o_plain) = cost(N, E); more than N+1 if it cannot pay)."""
        f = lambda e: e * self.plain_cost - self.step_cost(n, e)  # noqa: E731  (increasing in e here)
        if f(1.0) >= 0:
            return 1.0
        if f(n + 1.0) < 0:
            return self.step_cost(n, n + 1.0) / self.plain_cost
        lo, hi = 1.0, n + 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2

    def break_even_alpha(self, n: int) -> Optional[float]:
        """The i.i.d. per-token acceptance at which MTP at N ties with plain decoding (None: it cannot
        pay even at 100%)."""
        return solve_alpha(self.break_even_tokens(n), n)

    def ratio(self, n: int, acceptance_by_pos: Sequence[float]) -> float:
        """Predicted speed of MTP at N relative to plain decoding, for this acceptance curve
        (cumulative: A_i = P(first i+1 drafts accepted); positions past the curve count as 0)."""
        e = 1.0 + sum(acceptance_by_pos[:n])
        return e * self.plain_cost / self.step_cost(n, e)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overhead"] = {str(k): v for k, v in self.overhead.items()}
        d["break_even"] = [
            {"n": n, "tokens_per_step": self.break_even_tokens(n), "alpha": self.break_even_alpha(n)}
            for n in range(1, self.n_max + 1)
        ]
        return d


def expected_tokens(alpha: float, n: int) -> float:
    """sum_{i=0..n} alpha^i: tokens per verify step with i.i.d. acceptance alpha and n drafts."""
    return float(n + 1) if alpha >= 1.0 else (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def solve_alpha(tokens: float, n: int) -> Optional[float]:
    """The alpha in [0, 1] with expected_tokens(alpha, n) = tokens (0 if tokens <= 1; None if > n+1)."""
    if tokens <= 1.0:
        return 0.0
    if tokens > n + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, n) < tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def add_overheads(cm: CostModel, results: dict[int, GenStats], plain: Optional[GenStats]) -> CostModel:
    """Fill the per-step overheads (time outside llama_decode) from real runs: plain decoding and MTP at N."""
    T = cm.t_ms / 1e3
    if plain is not None and plain.n_verify:
        cm.overhead_plain = plain.t_overhead / plain.n_verify / T
    for n, s in results.items():
        if s.n_verify:
            cm.overhead[n] = s.t_overhead / s.n_verify / T
    return cm


__all__ = ["CostModel", "expected_tokens", "solve_alpha", "add_overheads"]
