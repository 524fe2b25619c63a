"""One session on a runtime: what the target's memory holds, as the chat or text that put it there,
and the prompt tokens for the next request (`generate -cnv` and `serve` alike).

    s = Session(rt)
    p = s.chat([{"role": "user", "content": "hi"}])
    gen = s.generate(p, cfg)            # a Generation: iterate it; gen.stats, gen.text, gen.tokens
    p = s.chat([..., {"role": "assistant", "content": gen.text}, {"role": "user", "content": "and?"}])

A chat that repeats the last conversation with its answer as generated, and adds turns, gets the
held tokens (each answer's own, as generated) plus the template's text between that answer and the
next (chat.continuation); a completion that extends the last prompt and its completion gets the
held tokens plus the extension's. Anything else is rendered and tokenized whole, and the runtime
keeps the longest prefix it shares with the memory (mtp_cli.memory): regenerate, an edited last
turn, a shared system prompt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from mtp_cli.chat import continuation, render
from mtp_cli.config import GenConfig
from mtp_cli.errors import ChatTemplateError, ConfigError
from mtp_cli.policy import DraftPolicy
from mtp_cli.runtime import Prepared, Runtime
from mtp_cli.stats import Generation, TokenEvent

Message = dict[str, Any]


@dataclass(frozen=True)
class Prompt:
    """A request's prompt tokens, and the chat messages or text they stand for (None for token ids)."""

    tokens: list[int]
    messages: Optional[list[Message]] = None  # ending where the answer begins (or continues)
    text: Optional[str] = None
    extra: Optional[dict[str, Any]] = None  # the template's other variables (tools, ...)

    def answered(self, answer: str) -> list[Message]:
        """The conversation once `answer` is given: a trailing assistant message continued by it, else
        a new assistant message."""
        msgs = list(self.messages or [])
        if msgs and msgs[-1].get("role") == "assistant":
            return [*msgs[:-1], {**msgs[-1], "content": str(msgs[-1].get("content") or "") + answer}]
        return [*msgs, {"role": "assistant", "content": answer}]


class Taken:
    """What a generation run by someone else (a batch runner) emitted, as they hand it its tokens."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._pieces: list[str] = []

    def add(self, ev: TokenEvent) -> None:
        self.tokens.append(ev.token)
        self._pieces.append(ev.text)

    @property
    def text(self) -> str:
        return "".join(self._pieces)


@dataclass(frozen=True)
class _Turn:
    prompt: Prompt
    gen: Union[Generation, Taken]


class Session:
    """The requests on one runtime's sequence `seq`, in order; `chat`/`text`/`ids` give the next
    prompt, `generate` runs it keeping what the memory holds of it (`prepare`: for a batch runner)."""

    def __init__(self, rt: Runtime, seq: int = 0):
        self.rt, self.seq = rt, seq
        self._last: Optional[_Turn] = None

    def chat(self, messages: Sequence[Message], extra: Optional[dict[str, Any]] = None) -> Prompt:
        """The prompt for `messages` (`extra`: the template's other variables, e.g. `tools`)."""
        msgs = [dict(m) for m in messages]
        if not msgs:
            raise ConfigError("`messages` is empty")
        bos, eos = self.rt.special_texts()
        t = self._last  # (the runtime keeps what its memory really holds of the tokens built from it)
        if t is not None and t.prompt.messages is not None and t.prompt.extra == extra:
            held = t.prompt.answered(t.gen.text)
            if len(msgs) > len(held) and msgs[: len(held)] == held:
                with contextlib.suppress(ChatTemplateError):  # (a template that drops answers: whole)
                    more = continuation(self.rt.chat_file, held, msgs[len(held) :], bos, eos, extra)
                    toks = self.rt.tokenize(more, add_special=False, parse_special=True)
                    return Prompt(t.prompt.tokens + t.gen.tokens + toks, msgs, extra=extra)
        text = render(self.rt.chat_file, msgs, bos, eos, extra)
        return Prompt(self.rt.tokenize(text, add_special=True, parse_special=True), msgs, extra=extra)

    def text(self, text: str) -> Prompt:
        if not text:
            raise ConfigError("`prompt` is empty")
        t = self._last  # (the runtime keeps what its memory really holds of the tokens built from it)
        if t is not None and t.prompt.text is not None:
            done = t.prompt.text + t.gen.text
            if len(text) > len(done) and text.startswith(done):
                more = self.rt.tokenize(text[len(done) :], add_special=False)
                return Prompt(t.prompt.tokens + t.gen.tokens + more, text=text)
        return Prompt(self.rt.tokenize(text, add_special=True), text=text)

    def ids(self, tokens: Sequence[int]) -> Prompt:
        return Prompt([int(x) for x in tokens])

    def generate(
        self,
        prompt: Prompt,
        cfg: GenConfig,
        policy: Optional[DraftPolicy] = None,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> Generation:
        """Generate from `prompt`, keeping the longest prefix the memory already holds of it."""
        self._last = None  # (until this generation ends, the memory is in flux)
        gen = self.rt.generate(prompt.tokens, cfg, policy=policy, reuse=True, seq=self.seq, progress=progress)
        self._last = _Turn(prompt, gen)
        return gen

    def prepare(self, prompt: Prompt, cfg: GenConfig, policy: Optional[DraftPolicy] = None) -> tuple[Prepared, Taken]:
        """`generate` for a batch runner (mtp_cli.slots): the prepared generation, and the record its
        tokens are to be added to as they come."""
        self._last = None
        prep = self.rt.prepare(prompt.tokens, cfg, policy=policy, reuse=True, seq=self.seq)
        taken = Taken()
        self._last = _Turn(prompt, taken)
        return prep, taken


__all__ = ["Session", "Prompt", "Message", "Taken"]
