"""llama-server's input shapes for its native /completion: the prompt (a text, token ids with texts
among them, a {prompt_string} object, or a list of those) and logit_bias (pairs or an object, keys
token ids or texts), read into what a text completion takes; a shape it cannot be is one line."""

from __future__ import annotations

import math
from typing import Any, Optional, Union

from mtp_cli.errors import ConfigError
from mtp_cli.serve.engine import Engine
from mtp_cli.serve.messages import lone_surrogate


def prompts(engine: Engine, prompt: Any) -> list[Union[str, list[int]]]:
    """llama-server's prompt shapes: a text, token ids with texts among them (one sequence), a
    {"prompt_string": ...} object, or a list of those (several prompts, answered as a list)."""
    seq = isinstance(prompt, list) and any(isinstance(p, int) for p in prompt)
    if isinstance(prompt, (str, dict)) or (seq and all(isinstance(p, (int, str)) for p in prompt)):
        return [one_prompt(engine, prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise ConfigError("`prompt` takes a text, token ids, a {prompt_string} object or a list of them")
    return [one_prompt(engine, p) for p in prompt]


def one_prompt(engine: Engine, prompt: Any) -> Union[str, list[int]]:
    if isinstance(prompt, dict):
        if prompt.get("multimodal_data"):
            raise ConfigError("`prompt.multimodal_data`: this model reads text")
        if not isinstance(prompt.get("prompt_string"), str):
            raise ConfigError("`prompt.prompt_string` is required")
        return str(prompt["prompt_string"])
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not all(isinstance(p, (int, str)) for p in prompt):
        raise ConfigError("`prompt` takes a text, token ids, a {prompt_string} object or a list of them")
    ids: list[int] = []
    for i, p in enumerate(prompt):  # (texts tokenized where they sit; the first one with BOS)
        ids += engine.rt.tokenize(p, add_special=i == 0) if isinstance(p, str) else [int(p)]
    return ids


def bias_ids(engine: Engine, bias: Union[list[list[Any]], dict[str, Any], None]) -> Optional[dict[str, float]]:
    """llama-server's logit_bias as token id -> bias: [[token id or text, bias or false]] (a text:
    each of its tokens) or {token id or text: bias}; false bans (OpenAI's -100)."""
    if not bias:
        return None
    pairs = [(k, v, True) for k, v in bias.items()] if isinstance(bias, dict) else [(*_pair(p), False) for p in bias]
    out: dict[str, float] = {}
    for key, value, keyed in pairs:
        if value is False:
            value = -100.0
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"`logit_bias`: the bias of {key!r} must be a number or false, got {value!r}")
        if isinstance(key, int) and not isinstance(key, bool):
            ids = [key]
        elif isinstance(key, str) and keyed and key.isascii() and key.isdigit():  # (OpenAI's {"id": bias})
            ids = [int(key)]
        elif isinstance(key, str) and not lone_surrogate(key):
            ids = engine.rt.tokenize(key, add_special=False)
        else:
            raise ConfigError(f"`logit_bias` keys are token ids or texts, got {key!r}")
        bad = [t for t in ids if not 0 <= t < engine.rt.n_vocab]
        if bad:
            raise ConfigError(f"`logit_bias`: {bad[0]} is outside the vocabulary (0..{engine.rt.n_vocab - 1})")
        out |= {str(t): float(value) for t in ids}
    return out


def _pair(p: Any) -> tuple[Any, Any]:
    if not isinstance(p, list) or len(p) != 2:
        raise ConfigError("`logit_bias` takes [token id or text, bias] pairs")
    return p[0], p[1]


__all__ = ["prompts", "one_prompt", "bias_ids"]
