"""The GGUF's own chat template (jinja2, as llama-cpp-python renders it): one turn (`--chat`), a
conversation, and the text a held conversation adds for its next turn (mtp_cli.session)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from gguf_tools.gguf_file import GGUFFile
from mtp_cli import llama_ext as lx
from mtp_cli.errors import ChatTemplateError

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BUILTIN = {"chatml": CHATML}  # --chat-template names given as Jinja here
# a --chat-template value naming one of llama.cpp's own templates (llama-server's names: llama3,
# command-r, mistral-v7, gemma...), rendered by llama.cpp itself, as llama-server renders it without --jinja
NATIVE = "llama.cpp:"


@dataclass(frozen=True)
class Templated:
    """A model file read through another chat template (llama-server's --chat-template / -file)."""

    file: GGUFFile
    template: str

    @property
    def path(self) -> Path:
        return self.file.path

    def get(self, name: str, default: Any = None) -> Any:
        return self.template if name == "tokenizer.chat_template" else self.file.get(name, default)


Source = Union[GGUFFile, Templated]  # where a chat template is read from


def template_text(value: str) -> str:
    """A --chat-template value: Jinja text (checked), or a built-in template's name (llama.cpp's)."""
    if value in BUILTIN:
        return BUILTIN[value]
    if value in lx.chat_builtin_templates():
        return NATIVE + value
    if "{%" not in value and "{{" not in value:
        names = ", ".join(sorted({*BUILTIN, *lx.chat_builtin_templates()}))
        raise ChatTemplateError(f"`chat_template`: {value!r} is neither a Jinja template nor one of {names}")
    return checked_template(value)


def checked_template(text: str) -> str:
    """A chat template given by the user, if it renders one user message (else one line naming it)."""
    if not text.strip():
        raise ChatTemplateError("`chat_template` is empty")
    if text.startswith(NATIVE):
        if text[len(NATIVE) :] not in lx.chat_builtin_templates():
            raise ChatTemplateError(f"`chat_template`: llama.cpp has no template {text[len(NATIVE) :]!r}")
        return text
    try:
        Jinja2ChatFormatter(text, eos_token="</s>", bos_token="<s>", add_generation_prompt=True)(
            messages=[{"role": "user", "content": "x"}]
        )
    except Exception as e:  # (the template is the user's code: its failure in one line)
        raise ChatTemplateError(f"`chat_template` does not render: {e}") from None
    return text


_MARK = "\x00mtp-cli-end-of-answer\x00"  # where an answer's text ends in a rendered history
_OPEN = "\x00mtp-cli-open-answer\x00"  # where a trailing assistant message is cut to be continued


def render(gf: Source, messages: list[Any], bos: str, eos: str, extra: Optional[dict[str, Any]] = None) -> str:
    """`messages` rendered, ending where the assistant's answer begins; when the last message is the
    assistant's own, where its text ends (the answer continues it, as llama-server's prefill does).
    `extra`: the template's other variables (`tools`, `enable_thinking`, ...)."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant":
        return _formatted(gf, messages, bos, eos, True, extra)
    opened = [*messages[:-1], {**last, "content": str(last.get("content") or "") + _OPEN}]
    text = _formatted(gf, opened, bos, eos, False, extra)
    if _OPEN not in text:
        raise ChatTemplateError(f"{gf.path}: the chat template drops the assistant's text: it cannot be continued")
    return text.split(_OPEN, 1)[0]


def template_of(gf: Source) -> str:
    template = gf.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template.strip():
        raise ChatTemplateError(f"{gf.path}: no chat template (tokenizer.chat_template); drop `chat`")
    return template


def _formatted(
    gf: Source, messages: list[Any], bos: str, eos: str, add_generation_prompt: bool, extra: Optional[dict[str, Any]]
) -> str:
    template = template_of(gf)
    if template.startswith(NATIVE):
        return _native(template[len(NATIVE) :], messages, add_generation_prompt)
    try:
        fmt = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt)
        return fmt(messages=messages, **(extra or {})).prompt
    except Exception as e:  # a template is code from the file: report its failure in one line
        raise ChatTemplateError(f"{gf.path}: the chat template failed to render: {e}") from None


def _native(name: str, messages: list[Any], add_generation_prompt: bool) -> str:
    """Messages through llama.cpp's own template `name`: roles and texts only (a text in parts is
    joined as llama-server joins it; tools and the other variables are Jinja's). NULs (this module's
    markers) travel as U+E000, outside C strings."""
    pairs = [(str(m.get("role", "")), _text(m.get("content")).replace("\x00", "\ue000")) for m in messages]
    return lx.chat_apply_template(name, pairs, add_generation_prompt).replace("\ue000", "\x00")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def chat_prompt(gf: Source, user: str, bos: str, eos: str, system: str | None = None) -> str:
    """The prompt text for one user turn, ending where the assistant's answer begins.

    `bos` / `eos` are the special tokens' texts (the template may spell them out)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    return render(gf, [*messages, {"role": "user", "content": user}], bos, eos)


def continuation(
    gf: Source, answered: list[Any], new: list[Any], bos: str, eos: str, extra: Optional[dict[str, Any]] = None
) -> str:
    """The template's text from the end of `answered`'s last message (the assistant's answer, as it
    was generated) through `new` messages, ending where the next answer begins: what a conversation
    held as tokens adds for its next turn."""
    last = answered[-1]
    marked = [*answered[:-1], {**last, "content": last["content"] + _MARK}, *new]
    text = render(gf, marked, bos, eos, extra)
    if _MARK not in text:
        raise ChatTemplateError(f"{gf.path}: the chat template drops the assistant's answers")
    return text.split(_MARK, 1)[1]
