"""What the target's memory holds between generations, and what of a new prompt it can keep.

A finished generation leaves its prompt and the tokens it decoded in the target's memory (Held); the
next one on the same contexts keeps the longest prefix its prompt shares with them (Reuse) and
decodes only the rest: the next turn of a chat, a regenerated answer, an edited last turn, a shared
system prompt. mtp_cli.session maps chat messages and completion texts onto these tokens. With
several sequences (slots), a prompt may instead start from a prefix another sequence holds, copied
in (`borrowed`): a system prompt or a document every conversation shares is read once, not once per
slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    donor: Optional[int] = None  # the sequence whose memory is copied in first (its prefix is what is kept)
    lender: Optional[Drafter] = None  # the donor's drafter, when of the same kind (Drafter.adopt)

    @property
    def rewound(self) -> bool:
        return self.held > self.keep or self.donor is not None

    def still_offered(self, offers: Mapping[int, Held], prompt: Sequence[int]) -> bool:
        """Whether the donor still holds what it was chosen for (it may have run since)."""
        h = offers.get(self.donor) if self.donor is not None else None
        return h is not None and common_prefix(h.tokens, prompt) >= self.keep and self.lender in (None, h.drafter)


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


# tokens a prefix another sequence holds must add to what a sequence keeps of its own to be copied in,
# at least, and per COPY_CELLS cells of a slot: the copy is of the donor's whole sequence (llama.cpp
# copies a split cache's stream whole), which for the demo's 1024-cell slots cost about one prompt
# row on a 2-core AMD EPYC (ARCHITECTURE §9); a huge slot of a small model costs more
COPY_GAIN, COPY_CELLS = 8, 128


def borrowed(
    prompt: Sequence[int], own: Optional[Reuse], offers: Mapping[int, Held], d: Drafter, recurrent: bool, cells: int
) -> Optional[Reuse]:
    """The longest prefix of `prompt` that another sequence's memory holds (`offers`: by sequence),
    to be copied in, if it beats what the sequence keeps of its own by enough tokens (COPY_GAIN, or
    one per COPY_CELLS of the slot's `cells`); None otherwise. The drafter then starts from the
    donor's (Drafter.adopt: a copy of what it holds, where it can); a recurrent state cannot drop
    the donor's tail."""
    if recurrent or not d.can_resume or not offers:
        return None
    shared = {s: min(common_prefix(h.tokens, prompt), len(prompt) - 1) for s, h in offers.items()}
    donor = max(shared, key=lambda s: shared[s])
    n = shared[donor]
    if n < (own.keep if own else 0) + max(COPY_GAIN, cells // COPY_CELLS):
        return None
    lender = offers[donor].drafter
    return Reuse(n, n, True, donor, lender if type(lender) is type(d) else None)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))


__all__ = ["Held", "Reuse", "borrowed", "common_prefix", "COPY_GAIN", "COPY_CELLS"]
