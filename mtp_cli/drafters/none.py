"""Plain decoding through the same loop: never drafts."""

from __future__ import annotations

from collections.abc import Sequence

from mtp_cli.drafters.base import Drafter


class NoDrafter(Drafter):
    name = "none"
    summary = "plain decoding"
    order = 0
    drafts = False
    can_resume = True

    def resume(self, prompt: Sequence[int], keep: int, asleep: bool, rewound: bool) -> None:
        pass
