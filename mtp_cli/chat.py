"""`--chat`: render the GGUF's own chat template (jinja2, as llama-cpp-python renders it)."""

from __future__ import annotations

from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from gguf_tools.gguf_file import GGUFFile
from mtp_cli.errors import ChatTemplateError


def chat_prompt(gf: GGUFFile, user: str, bos: str, eos: str, system: str | None = None) -> str:
    """The prompt text for one user turn, ending where the assistant's answer begins.

    `bos` / `eos` are the special tokens' texts (the template may spell them out)."""
    template = gf.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template.strip():
        raise ChatTemplateError(f"{gf.path}: no chat template (tokenizer.chat_template); drop `chat`")
    messages: list[Any] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    try:
        fmt = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)
        return fmt(messages=messages).prompt
    except Exception as e:  # a template is code from the file: report its failure in one line
        raise ChatTemplateError(f"{gf.path}: the chat template failed to render: {e}") from None
