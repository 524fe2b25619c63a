"""Plain decoding through the same loop: never drafts."""

from __future__ import annotations

from mtp_cli.drafters.base import Drafter


class NoDrafter(Drafter):
    name = "none"
    summary = "plain decoding"
    order = 0
