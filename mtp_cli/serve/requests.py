"""The request bodies of /v1/chat/completions and /v1/completions (pydantic), and what they mean for
a generation: the GenConfig fields they set, their stop strings, their prompt.

Fields the OpenAI API defines and mtp-cli cannot honour are refused by name (400), and so is any
field neither knows; a field that does nothing at its default (n = 1, presence_penalty = 0,
logprobs false...) is accepted at that default only.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from mtp_cli.errors import ConfigError

MAX_STOP = 4  # the OpenAI API's limit on stop strings
# request field -> the GenConfig field it sets (errors name the request's field: request_name)
CONFIG_FIELD = {
    "temperature": "temp",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "max_tokens": "n_predict",
}
_REQUEST_FIELD = {cfg: field for field, cfg in CONFIG_FIELD.items()}


def request_name(config_field: str) -> str:
    """How a request spells a GenConfig field (for errors the library raises naming its fields)."""
    return _REQUEST_FIELD.get(config_field, config_field)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(_Strict):
    include_usage: bool = False


class Sampling(_Strict):
    """The fields both endpoints share."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)  # (llama-server's)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)  # (llama-server's)
    repeat_penalty: Optional[float] = Field(None, gt=0.0)  # (llama-server's)
    ignore_eos: Optional[bool] = None  # (llama-server's)
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # (accepted, unused)
    # accepted at their no-op values only (checked by `unsupported`)
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Union[bool, int, None] = None
    logit_bias: Optional[dict[str, float]] = None

    def unsupported(self) -> Optional[str]:
        """The first field set to something mtp-cli does not do, said in one line; None if none."""
        if self.n != 1:
            return f"`n` must be 1 (one completion per request), got {self.n}"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return f"`{name}` is not supported (use `repeat_penalty`)"
        if self.logprobs:
            return "`logprobs` is not supported"
        if self.logit_bias:
            return "`logit_bias` is not supported"
        stops = self.stop_strings()
        if len(stops) > MAX_STOP or any(not s for s in stops):
            return f"`stop` takes 1 to {MAX_STOP} non-empty strings"
        return None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def n_predict(self) -> Optional[int]:
        return self.max_tokens

    def max_tokens_field(self) -> str:
        """The field that set n_predict, as the request spelled it."""
        return "`max_tokens`"

    def overrides(self) -> dict[str, Any]:
        """The GenConfig fields this request sets (the server's own settings fill the rest)."""
        pairs = {cfg: getattr(self, field) for field, cfg in CONFIG_FIELD.items() if field != "max_tokens"}
        pairs["n_predict"] = self.n_predict()
        return {k: v for k, v in pairs.items() if v is not None}


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    response_format: Optional[dict[str, Any]] = None  # {"type": "text"} only
    tools: Optional[list[Any]] = None  # refused when given
    tool_choice: Optional[Any] = None
    top_logprobs: Optional[int] = None

    def unsupported(self) -> Optional[str]:
        if self.tools or self.tool_choice not in (None, "none"):
            return "`tools` are not supported"
        if self.response_format not in (None, {"type": "text"}):
            return '`response_format` supports only {"type": "text"}'
        if self.top_logprobs:
            return "`top_logprobs` is not supported"
        return super().unsupported()

    def n_predict(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_field(self) -> str:
        return "`max_completion_tokens`" if self.max_completion_tokens is not None else "`max_tokens`"

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them ("developer" is the newer name for "system")."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(Sampling):
    prompt: Union[str, list[str], list[int]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def unsupported(self) -> Optional[str]:
        if self.echo:
            return "`echo` is not supported"
        if self.suffix:
            return "`suffix` is not supported"
        if self.best_of not in (None, 1):
            return "`best_of` must be 1"
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            return f"`prompt`: one prompt per request, got {len(self.prompt)}"
        return super().unsupported()

    def prompt_text(self) -> Optional[str]:
        """The prompt as text, or None when it was given as token ids."""
        if isinstance(self.prompt, str):
            return self.prompt
        if self.prompt and isinstance(self.prompt[0], str):
            return str(self.prompt[0])
        return None if self.prompt else ""

    def prompt_ids(self) -> list[int]:
        return [int(t) for t in self.prompt] if isinstance(self.prompt, list) and self.prompt_text() is None else []


def check(req: Sampling) -> None:
    """ConfigError naming the first unsupported field."""
    why = req.unsupported()
    if why:
        raise ConfigError(why)


__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "Message",
    "Sampling",
    "check",
    "request_name",
    "MAX_STOP",
    "CONFIG_FIELD",
]
