"""What one generation reports: its tokens as TokenEvents, and GenStats (one pooling operation for many)."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

StopReason = Literal["eog", "n_predict", "ctx_full", "interrupted", "error"]
# the ends at which what the target's memory holds is known (an interrupted or failed generation
# may have stopped inside a decode)
FINISHED: tuple[StopReason, ...] = ("eog", "n_predict", "ctx_full")
Source = Literal["draft", "target"]  # "draft": drafted and accepted; "target": the target's own token


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # this token's share of the UTF-8 text ("" while a multi-byte character is incomplete)
    source: Source
    step: int  # verify pass that produced it (0: sampled from the prompt's logits)
    logprob: Optional[float] = None  # its log-probability (GenConfig.logprobs set)
    top: tuple[tuple[int, float], ...] = ()  # the most likely tokens there, with theirs


# summed when pooling; everything else is derived, or (spec_type, stop_reason, n_max) describes the run
_SUMMED = (
    "n_prompt",
    "n_cached",
    "n_tokens",
    "n_first",
    "t_prompt",
    "t_gen",
    "t_consumer",
    "n_verify",
    "n_drafted",
    "n_accepted",
    "t_target_decode",
    "t_draft_decode",
    "n_draft_decode",
)
_DERIVED = (
    "acceptance",
    "acceptance_by_pos",
    "mean_accepted_per_pass",
    "tokens_per_pass",
    "tokens_per_second",
    "prompt_tokens_per_second",
    "t_decode",
    "t_overhead",
)


@dataclass
class GenStats:
    spec_type: str = "none"
    n_max: int = 0  # effective draft length limit (after the drafter's own cap)
    n_prompt: int = 0
    n_cached: int = 0  # of those, already in memory from the last generation (not decoded again)
    n_tokens: int = 0  # generated tokens (an EOG token that ended generation is not counted)
    n_first: int = 0  # of those, sampled from a prompt pass's logits (1 per generation that emitted any)
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

    @classmethod
    def pooled(cls, runs: Iterable[GenStats], spec_type: Optional[str] = None) -> GenStats:
        """Sums over generations (tokens/s = total tokens / total generation seconds, so long and short
        generations weigh by their tokens); the spec type of the last run unless given."""
        total = cls()
        for s in runs:
            for name in _SUMMED:
                setattr(total, name, getattr(total, name) + getattr(s, name))
            total.n_max = max(total.n_max, s.n_max)
            total.spec_type = s.spec_type
            n = max(len(total.drafted_at), len(s.drafted_at))
            total.drafted_at = _add(total.drafted_at, s.drafted_at, n)
            total.accepted_at = _add(total.accepted_at, s.accepted_at, n)
        if spec_type is not None:
            total.spec_type = spec_type
        return total

    def count_drafts(self, k: int, a: int) -> None:
        """A verify pass of k drafts kept a of them."""
        self.n_drafted += k
        self.n_accepted += a
        for i in range(k):
            self.drafted_at[i] += 1
        for i in range(a):
            self.accepted_at[i] += 1

    @property
    def finished(self) -> bool:
        """It ran to one of its own ends (FINISHED), not stopped by its consumer or a failure."""
        return self.stop_reason in FINISHED

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
        """Tokens generated after the prompt pass per second of generating them; 0.0 when there were
        none (`-n 1`: the one token is the prompt pass's, with no generation time to divide by)."""
        n = self.n_tokens - self.n_first
        return n / self.t_gen if n > 0 and self.t_gen > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        """Prompt tokens decoded (cached ones are not) per second of the prompt pass."""
        return (self.n_prompt - self.n_cached) / self.t_prompt if self.t_prompt > 0 else 0.0

    @property
    def t_decode(self) -> float:
        return self.t_target_decode + self.t_draft_decode

    @property
    def t_overhead(self) -> float:
        """Generation seconds outside llama_decode: Python, sampling, rollback, event building."""
        return max(0.0, self.t_gen - self.t_decode)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), **{k: getattr(self, k) for k in _DERIVED}}


class Generation:
    """One generation: iterate it for its TokenEvents (`close()` stops it early, as a `break` does);
    `stats` is live while it runs and final once it ends; `tokens` and `text` are what it emitted."""

    def __init__(self, events: Generator[TokenEvent, None, Any], stats: GenStats):
        self._events, self.stats = events, stats
        self.tokens: list[int] = []
        self._pieces: list[str] = []

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> TokenEvent:
        return self._took(next(self._events))

    def throw(self, exc: BaseException) -> TokenEvent:
        """Raise `exc` where the generation is suspended (a KeyboardInterrupt ends it as "interrupted")."""
        return self._took(self._events.throw(exc))

    def _took(self, ev: TokenEvent) -> TokenEvent:
        self.tokens.append(ev.token)
        self._pieces.append(ev.text)
        return ev

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def close(self) -> None:
        self._events.close()

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _add(a: list[int], b: list[int], n: int) -> list[int]:
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


__all__ = ["GenStats", "Generation", "TokenEvent", "StopReason", "Source", "FINISHED"]
