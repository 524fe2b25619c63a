"""The request bodies of /v1/chat/completions and /v1/completions (pydantic), and what they mean for
a generation: the GenConfig fields they set, their stop strings, their prompt.

Every field of OpenAI's current schemas is accepted (and llama-server's own that clients send), at
any value that does not change the output or that mtp-cli honours; a value it cannot honour is
refused by name (400), and so is a field neither API knows (a misspelling is not dropped silently).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

from pydantic import Field

from mtp_cli import llama_ext as lx
from mtp_cli import schemas
from mtp_cli.config import DRAFT_N_MAX_LIMIT, MAX_LOGPROBS
from mtp_cli.errors import ConfigError
from mtp_cli.serve.messages import Message, Strict, lone_surrogate, template_messages
from mtp_cli.serve.reasoning import Format

MAX_STOP = 4  # the OpenAI API's limit on stop strings
MAX_CHOICES = 16  # `n`: each choice is a generation of its own (batched with -np)
# request field -> the GenConfig field it sets (errors name the request's field: request_name)
CONFIG_FIELD = {
    "temperature": "temp",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "max_tokens": "n_predict",
}
_REQUEST_FIELD = {cfg: field for field, cfg in CONFIG_FIELD.items()}


def request_name(config_field: str) -> str:
    """How a request spells a GenConfig field (for errors the library raises naming its fields)."""
    return _REQUEST_FIELD.get(config_field, config_field)


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool = False  # (no obfuscation is ever added: accepted either way)


class Sampling(Strict):
    """The fields both endpoints share."""

    model: Optional[str] = None  # any name: the one model is served under all of them (as llama-server)
    max_tokens: Optional[int] = Field(None, ge=1)
    n_predict: Optional[int] = Field(None, ge=-1)  # (llama-server's)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)  # (llama-server's)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)  # (llama-server's)
    repeat_penalty: Optional[float] = Field(None, gt=0.0)  # (llama-server's)
    repeat_last_n: Optional[int] = Field(None, ge=0)  # (llama-server's)
    ignore_eos: Optional[bool] = None  # (llama-server's)
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = Field(1, ge=1, le=MAX_CHOICES)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)  # (None: the server's own)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None  # token id -> bias (-100: never, as OpenAI's)
    grammar: Optional[str] = None  # (llama-server's: GBNF)
    json_schema: Optional[dict[str, Any]] = None  # (llama-server's)
    n_probs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)  # (llama-server's)
    post_sampling_probs: Optional[bool] = None  # (llama-server's: probabilities as the sampler chain drew)
    verbose: Optional[bool] = None  # (llama-server's: `__verbose`, the prompt as decoded, beside the answer)
    # bookkeeping fields that change nothing in the output
    user: Optional[str] = None
    store: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None
    prompt_cache_key: Optional[str] = None  # (the cache keeps the longest common prefix by itself)
    prompt_cache_retention: Optional[str] = None
    safety_identifier: Optional[str] = None
    cache_prompt: Optional[bool] = None  # (llama-server's: the prefix cache is always on)
    id_slot: Optional[int] = None  # (llama-server's: one slot)
    timings_per_token: Optional[bool] = None  # (llama-server's: timings come with the last chunk)
    return_progress: Optional[bool] = None  # (llama-server's: prompt_progress chunks while the prompt is read)
    mtp_pieces: Optional[bool] = None  # (mtp-cli's: each streamed chunk lists its tokens, drafted or not)
    # (llama-server's: below 1 it is 0, no drafts for this request)
    spec_n_max: Optional[int] = Field(None, alias="speculative.n_max", le=DRAFT_N_MAX_LIMIT)
    # llama-server's samplers, at their off values only
    typical_p: Optional[float] = None
    mirostat: Optional[int] = None

    def unsupported(self) -> Optional[str]:
        """The first field set to something mtp-cli does not do, said in one line; None if none."""
        bad = [k for k in self.logit_bias or {} if not k.strip().isdigit()]
        if bad:
            return f"`logit_bias` keys are token ids, got {bad[0]!r}"
        if self.typical_p not in (None, 1.0):
            return "`typical_p` is not supported (only 1: off)"
        if self.mirostat not in (None, 0):
            return "`mirostat` is not supported (only 0: off)"
        if self.grammar_sources() > 1:
            return "give one of `grammar`, `json_schema` and `response_format`"
        stops = self.stop_strings()
        if len(stops) > MAX_STOP or any(not s for s in stops):
            return f"`stop` takes 1 to {MAX_STOP} non-empty strings"
        where = lone_surrogate(self.model_dump(exclude_none=True))
        if where:
            return f"`{where}` holds a lone surrogate (valid JSON, but not text)"
        return None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def requested_tokens(self) -> Optional[int]:
        """The most tokens the request asks for (None: the server's own -n)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return self.n_predict if self.n_predict is not None and self.n_predict >= 0 else None

    def overrides(self) -> dict[str, Any]:
        """The GenConfig fields this request sets (the server's own settings fill the rest)."""
        pairs = {cfg: getattr(self, field) for field, cfg in CONFIG_FIELD.items() if field != "max_tokens"}
        pairs["n_predict"] = self.requested_tokens()
        pairs["presence_penalty"], pairs["frequency_penalty"] = self.presence_penalty, self.frequency_penalty
        if self.logit_bias:  # (OpenAI's -100 bans a token: llama.cpp's -inf)
            pairs["logit_bias"] = tuple((int(k), -math.inf if v <= -100 else v) for k, v in self.logit_bias.items())
        pairs["grammar"] = self.grammar_text()
        if self.spec_n_max is not None and self.spec_n_max > 0:  # (a fixed draft length; 0 is Engine.begin's)
            pairs["draft_n_max"], pairs["draft_mode"] = self.spec_n_max, "fixed"
        pairs["logprobs"] = self.logprob_count()
        pairs["post_sampling_probs"] = self.post_sampling_probs
        return {k: v for k, v in pairs.items() if v is not None}

    def output_format(self) -> Optional[dict[str, Any]]:
        """response_format, where the endpoint has one and it asks for more than text."""
        return None

    def grammar_sources(self) -> int:
        return sum(x is not None for x in (self.grammar, self.json_schema))

    def grammar_text(self) -> Optional[str]:
        """The GBNF the output must follow: `grammar`, or `json_schema` / `response_format` turned into one."""
        if self.grammar is not None:
            return self.grammar
        fmt = self.output_format()
        schema: Any = self.json_schema
        name = "json_schema"
        if fmt is not None:
            kind = fmt.get("type")
            if kind == "json_object":  # (llama-server's `schema` beside it is honoured)
                if fmt.get("schema") is None:
                    return lx.JSON_GRAMMAR
                schema, name = fmt["schema"], "response_format.schema"
            else:
                spec = fmt.get("json_schema")
                if kind != "json_schema" or not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                    raise ConfigError("`response_format` takes text, json_object or json_schema with a `schema` object")
                schema, name = spec["schema"], "response_format.json_schema.schema"
        return None if schema is None else schemas.checked(schema, name)

    def logprob_count(self) -> Optional[int]:
        """How many alternatives to report with each token's log-probability (None: no log-probabilities)."""
        return self.n_probs or None

    def texts_size(self) -> int:
        """Characters of the request's prompt text (a bound on its tokens, checked before tokenizing)."""
        return 0


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    response_format: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    functions: Optional[list[dict[str, Any]]] = None
    function_call: Union[str, dict[str, Any], None] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    modalities: Optional[list[str]] = None
    audio: Optional[dict[str, Any]] = None
    prediction: Optional[dict[str, Any]] = None  # (a predicted output changes speed, not the output)
    reasoning_effort: Optional[str] = None
    verbosity: Optional[str] = None
    web_search_options: Optional[dict[str, Any]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # (llama-server's: passed to the template)
    continue_final_message: Optional[bool] = None  # (vLLM's: a last assistant message is continued anyway)
    add_generation_prompt: Optional[bool] = None  # (vLLM's: false only with a last assistant message)
    reasoning_format: Optional[Format] = None  # (llama-server's: where a thinking model's reasoning goes)

    def unsupported(self) -> Optional[str]:
        forcing = self.tool_choice not in (None, "none", "auto") or isinstance(self.function_call, dict)
        if forcing and self.grammar_sources():
            return "a forced `tool_choice` and `grammar`, `json_schema` or `response_format` exclude each other"
        if self.modalities and set(self.modalities) - {"text"}:
            return f"`modalities`: this model writes text only, got {self.modalities}"
        if self.audio:
            return "`audio` output is not supported"
        if self.web_search_options is not None:
            return "`web_search_options`: this server does not search the web"
        for i, m in enumerate(self.messages):  # (an image part, say: refused naming it)
            m.text(f"messages.{i}")
        prefill = self.messages[-1].role == "assistant"
        if self.continue_final_message and self.add_generation_prompt:
            return "`continue_final_message` and `add_generation_prompt` exclude each other"
        if (self.continue_final_message or self.add_generation_prompt is False) and not prefill:
            return "`continue_final_message` needs a last message of the assistant's to continue"
        if self.continue_final_message is False and prefill:
            return "`continue_final_message`: a last assistant message is always continued here"
        return super().unsupported()

    def requested_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else super().requested_tokens()

    def output_format(self) -> Optional[dict[str, Any]]:
        return self.response_format if self.response_format not in (None, {"type": "text"}) else None

    def grammar_sources(self) -> int:
        return sum(x is not None for x in (self.grammar, self.json_schema, self.output_format()))

    def tools_asked(self) -> tuple[list[Any], Any]:
        """(tools, tool_choice), the deprecated `functions` / `function_call` read as them."""
        if self.tools is not None:
            return self.tools, self.tool_choice
        funcs = [{"type": "function", "function": f} for f in self.functions or []]
        choice = self.function_call
        return funcs, {"type": "function", "function": choice} if isinstance(choice, dict) else choice

    def logprob_count(self) -> Optional[int]:
        if self.logprobs or self.top_logprobs:
            return self.top_logprobs or 0
        return super().logprob_count()

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them."""
        return template_messages(self.messages)

    def texts_size(self) -> int:
        return sum(len(m.text(f"messages.{i}")) for i, m in enumerate(self.messages))


class CompletionRequest(Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: Optional[bool] = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None
    logprobs: Optional[int] = Field(None, ge=0, le=5)

    def unsupported(self) -> Optional[str]:
        if self.echo:
            return "`echo` is not supported"
        if self.suffix:
            return "`suffix` is not supported"
        if self.best_of not in (None, 1):
            return "`best_of` must be 1"
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], (str, list)):
            if len(self.prompt) != 1:
                return f"`prompt`: one prompt per request, got {len(self.prompt)}"
        return super().unsupported()

    def logprob_count(self) -> Optional[int]:
        return self.logprobs if self.logprobs is not None else super().logprob_count()

    def prompt_text(self) -> Optional[str]:
        """The prompt as text, or None when it was given as token ids."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if p and isinstance(p[0], str):
            return str(p[0])
        return None if p else ""

    def prompt_ids(self) -> list[int]:
        p = self.prompt
        if not isinstance(p, list) or self.prompt_text() is not None:
            return []
        ids: list[Any] = p[0] if p and isinstance(p[0], list) else p
        return [int(t) for t in ids]

    def texts_size(self) -> int:
        return len(self.prompt_text() or "")


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
    "MAX_CHOICES",
    "CONFIG_FIELD",
]
