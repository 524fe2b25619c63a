"""A thinking model's reasoning split from its answer, as llama-server's --reasoning-format does:
`<think>...</think>` (opened by the answer, or already by the prompt, as DeepSeek-R1's and Qwen3's
templates do) goes to the message's `reasoning_content`, the rest to `content`.

    none             nothing split: the thinking stays in content
    auto, deepseek   the thinking in reasoning_content only (llama-server's default, auto)
    deepseek-legacy  the thinking in reasoning_content, and content as the model wrote it
"""

from __future__ import annotations

from typing import Literal

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ["none", "auto", "deepseek", "deepseek-legacy"]  # (the Literal below spells them again: typing needs it)
Format = Literal["none", "auto", "deepseek", "deepseek-legacy"]


def opens_thinking(prompt_text: str | None) -> bool:
    """The rendered prompt ends inside a thinking block (the template opened it for the answer)."""
    if not prompt_text:
        return False
    tail = prompt_text.rstrip()
    return tail.endswith(OPEN) and tail.rfind(OPEN) > tail.rfind(CLOSE)


class ThinkSplit:
    """An answer's text as it streams, split into (reasoning, content) pieces. What could still be
    the start of a tag is held back until the next piece says what it is."""

    def __init__(self, fmt: str, opened: bool = False):
        self.on = fmt != "none"
        self.legacy = fmt == "deepseek-legacy"
        self.state = "think" if opened else "start"  # start -> (think -> after ->) text
        self.buf = ""
        self.said = False  # (reasoning sent already: its leading blanks are behind)

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of this piece, as far as they can be told yet."""
        if not self.on:
            return "", text
        self.buf += text
        reasoning, content = self._advance()
        return reasoning, text if self.legacy else content

    def close(self) -> tuple[str, str]:
        """The rest: an unclosed thinking block is reasoning; held-back text is content."""
        if not self.on:
            return "", ""
        reasoning, content = self._advance()
        rest, self.buf = self.buf, ""
        if self.state == "think":
            reasoning += rest.rstrip()
        else:
            content += rest
        return reasoning, "" if self.legacy else content

    def _advance(self) -> tuple[str, str]:
        reasoning = content = ""
        while True:
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(OPEN):
                    self.buf, self.state = s[len(OPEN) :], "think"
                elif not s or OPEN.startswith(s):
                    return reasoning, content  # (whitespace, or what may be "<think>" not yet whole)
                else:
                    self.state = "text"
            elif self.state == "think":
                if not reasoning and not self.said:
                    self.buf = self.buf.lstrip()  # (the reasoning's leading blank lines)
                    if OPEN.startswith(self.buf) and self.buf:
                        return reasoning, content  # (an opener the prompt's already had may be arriving)
                    if self.buf.startswith(OPEN):  # (written again after the prompt's: not reasoning)
                        self.buf = self.buf[len(OPEN) :]
                        continue
                i = self.buf.find(CLOSE)
                if i >= 0:
                    reasoning += self.buf[:i].rstrip()
                    self.buf, self.state = self.buf[i + len(CLOSE) :], "after"
                    continue
                # held back: what may begin the closing tag, and trailing blanks (they may precede it)
                keep = _partial(self.buf, CLOSE)
                body = self.buf[: len(self.buf) - keep]
                ready = body.rstrip()
                reasoning += ready
                self.buf = self.buf[len(ready) :]
                self.said = self.said or bool(ready)
                return reasoning, content
            elif self.state == "after":  # (the blank lines between the thinking and the answer)
                s = self.buf.lstrip()
                if not s:
                    self.buf = ""
                    return reasoning, content
                self.buf, self.state = s, "text"
            else:
                content += self.buf
                self.buf = ""
                return reasoning, content


def answer_start(text: str, opened: bool = False) -> int:
    """Where the answer after a thinking block begins in `text` so far (0: there is none; -1: the
    block is not closed yet, or an opener may be arriving): tool calls are looked for from there."""
    s = text.lstrip()
    if not opened and not s.startswith(OPEN):
        return -1 if s and OPEN.startswith(s) else 0
    i = text.find(CLOSE)
    return -1 if i < 0 else i + len(CLOSE)


def blocks_format(fmt: str) -> str:
    """The format for APIs that give reasoning a block or item of its own (Messages, Responses):
    deepseek-legacy's reasoning also left in the text has no place there, so it is deepseek's."""
    return "deepseek" if fmt == "deepseek-legacy" else fmt


def split(text: str, fmt: str, opened: bool = False) -> tuple[str, str]:
    """A whole answer's (reasoning, content)."""
    s = ThinkSplit(fmt, opened)
    r1, c1 = s.feed(text)
    r2, c2 = s.close()
    return r1 + r2, c1 + c2


def _partial(text: str, tag: str) -> int:
    """The length of text's longest end that begins tag (held back: the tag may be arriving)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


__all__ = [
    "ThinkSplit",
    "split",
    "answer_start",
    "blocks_format",
    "opens_thinking",
    "FORMATS",
    "Format",
    "OPEN",
    "CLOSE",
]
