"""`--chat` and `-cnv`: render the GGUF's own chat template (jinja2, as llama-cpp-python renders it),
for one turn or a conversation whose history stays as tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from gguf_tools.gguf_file import GGUFFile
from mtp_cli.errors import ChatTemplateError

_MARK = "\x00mtp-cli-end-of-answer\x00"  # where an answer's text ends in a rendered history


def render(gf: GGUFFile, messages: list[Any], bos: str, eos: str) -> str:
    """`messages` rendered, ending where the assistant's answer begins."""
    template = gf.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template.strip():
        raise ChatTemplateError(f"{gf.path}: no chat template (tokenizer.chat_template); drop `chat`")
    try:
        return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(messages=messages).prompt
    except Exception as e:  # a template is code from the file: report its failure in one line
        raise ChatTemplateError(f"{gf.path}: the chat template failed to render: {e}") from None


def chat_prompt(gf: GGUFFile, user: str, bos: str, eos: str, system: str | None = None) -> str:
    """The prompt text for one user turn, ending where the assistant's answer begins.

    `bos` / `eos` are the special tokens' texts (the template may spell them out)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    return render(gf, [*messages, {"role": "user", "content": user}], bos, eos)


def continuation(gf: GGUFFile, answered: list[Any], new: list[Any], bos: str, eos: str) -> str:
    """The template's text from the end of `answered`'s last message (the assistant's answer, as it
    was generated) through `new` messages, ending where the next answer begins: what a conversation
    held as tokens adds for its next turn."""
    last = answered[-1]
    marked = [*answered[:-1], {**last, "content": last["content"] + _MARK}, *new]
    text = render(gf, marked, bos, eos)
    if _MARK not in text:
        raise ChatTemplateError(f"{gf.path}: the chat template drops the assistant's answers; use --chat")
    return text.split(_MARK, 1)[1]


Tokenize = Callable[[str, bool], list[int]]  # (text, add_special) -> tokens, special tokens parsed


class Conversation:
    """A multi-turn chat as one growing token sequence: each answer's own tokens stay as they were
    generated, and each new turn adds only the template's text between that answer and the next
    one (so the runtime, given reuse, decodes only the new turn)."""

    def __init__(self, gf: GGUFFile, bos: str, eos: str, tokenize: Tokenize, system: str | None = None):
        self.gf, self.bos, self.eos, self.tokenize = gf, bos, eos, tokenize
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        self.tokens: list[int] = []

    def ask(self, user: str) -> list[int]:
        """The whole sequence to generate the answer to `user` from."""
        if not self.tokens:
            self.messages.append({"role": "user", "content": user})
            self.tokens = self.tokenize(render(self.gf, self.messages, self.bos, self.eos), True)
            return list(self.tokens)
        turn = {"role": "user", "content": user}
        text = continuation(self.gf, self.messages, [turn], self.bos, self.eos)
        self.messages.append(turn)
        self.tokens += self.tokenize(text, False)
        return list(self.tokens)

    def answered(self, text: str, tokens: list[int]) -> None:
        """The answer the model gave (possibly cut short), as text and as its generated tokens."""
        self.messages.append({"role": "assistant", "content": text})
        self.tokens += tokens
