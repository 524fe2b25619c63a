"""What the target's memory holds between generations, and what of a new prompt it can keep.

A finished generation leaves its prompt and the tokens it decoded in the target's memory (Held); the
next one on the same contexts keeps the longest prefix its prompt shares with them (Reuse) and
decodes only the rest: the next turn of a chat, a regenerated answer, an edited last turn, a shared
system prompt. mtp_cli.session maps chat messages and completion texts onto these tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from mtp_cli.drafters import Drafter


@dataclass(frozen=True)
class Reuse:
    """What the target's memory already holds of a prompt, left by the last generation on it."""

    keep: int  # prompt[:keep] sits at positions 0..keep-1
    held: int  # positions the memory holds: keep..held-1 are dropped before the rest is decoded
    asleep: bool  # the drafter ended that generation skipped (policy.sleep)

    @property
    def rewound(self) -> bool:
        return self.held > self.keep


@dataclass(frozen=True)
class Held:
    """The tokens a finished generation left in the target's memory, and the drafter that followed them."""

    tokens: list[int]
    drafter: Drafter
    asleep: bool

    def reuse(self, prompt: list[int], d: Drafter, recurrent: bool) -> Optional[Reuse]:
        """What of `prompt` the memory can keep: the longest prefix it shares with these tokens (the
        same drafter, able to resume, goes on), short of the prompt's last token, which is decoded
        for its logits; on a recurrent target only all of them (its state cannot drop a tail)."""
        if d is not self.drafter or not d.can_resume:
            return None
        n = min(common_prefix(self.tokens, prompt), len(prompt) - 1)
        if n <= 0 or (recurrent and n < len(self.tokens)):
            return None
        # (contexts keep llama.cpp's default swa_full: a sliding-window cache still holds every cell)
        return Reuse(n, len(self.tokens), self.asleep)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))


__all__ = ["Held", "Reuse", "common_prefix"]
