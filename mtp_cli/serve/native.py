"""llama-server's own endpoints, which front-ends written for it call first: /props, /slots,
/tokenize, /detokenize, /apply-template and the native /completion (its request fields mapped
onto a text completion, its answer and stream in llama-server's shape, with the `mtp` object)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any, Optional, Union

import pydantic
from fastapi.responses import StreamingResponse
from pydantic import Field

from mtp_cli import __version__
from mtp_cli.chat import render, template_of
from mtp_cli.config import MAX_LOGPROBS
from mtp_cli.errors import ChatTemplateError, ConfigError, MtpError
from mtp_cli.serve.engine import Engine
from mtp_cli.serve.events import Delta, Done, Failed, Progress, Started, TokenProb
from mtp_cli.serve.messages import Strict, lone_surrogate
from mtp_cli.serve.native_inputs import bias_ids, prompts
from mtp_cli.serve.openai_out import SSE_HEADERS
from mtp_cli.serve.replies import GONE, error, failed
from mtp_cli.serve.requests import ChatRequest, CompletionRequest, check
from mtp_cli.serve.runs import Run

STOP_TYPE = {"length": "limit", "stop": "eos", "tool_calls": "eos"}


class TokenizeRequest(Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    tokens: list[int]


class NativeRequest(Strict):
    """llama-server's /completion fields; samplers mtp-cli has not are accepted at their off values."""

    prompt: Union[str, list[Any], dict[str, Any]]
    n_predict: Optional[int] = Field(None, ge=-1)
    temperature: Optional[float] = Field(None, ge=0.0)
    top_k: Optional[int] = Field(None, ge=0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    stream: bool = False
    stop: Optional[list[str]] = None
    repeat_penalty: Optional[float] = Field(None, gt=0.0)
    repeat_last_n: Optional[int] = Field(None, ge=-1)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    seed: Optional[int] = None
    ignore_eos: Optional[bool] = None
    logit_bias: Union[list[list[Any]], dict[str, Any], None] = None
    n_probs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    post_sampling_probs: Optional[bool] = None  # (probabilities as the sampler chain drew: prob, top_probs)
    grammar: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = None
    return_tokens: bool = False
    # accepted, no effect on the output: the prefix cache is always on, one slot is as good as another
    cache_prompt: Optional[bool] = None
    id_slot: Optional[int] = None
    timings_per_token: Optional[bool] = None
    return_progress: Optional[bool] = None
    n_keep: Optional[int] = None
    n_cache_reuse: Optional[int] = None
    samplers: Optional[list[str]] = None  # (llama.cpp's default order is the one used)
    min_keep: Optional[int] = None
    sse_ping_interval: Optional[float] = None
    backend_sampling: Optional[bool] = None  # (where llama.cpp samples: the same draws either way)
    # llama-server's other samplers, at their off values only
    typical_p: Optional[float] = None
    mirostat: Optional[int] = None
    mirostat_tau: Optional[float] = None
    mirostat_eta: Optional[float] = None
    dynatemp_range: Optional[float] = None
    dynatemp_exponent: Optional[float] = None
    dry_multiplier: Optional[float] = None
    dry_base: Optional[float] = None
    dry_allowed_length: Optional[int] = None
    dry_penalty_last_n: Optional[int] = None
    dry_sequence_breakers: Optional[list[str]] = None
    xtc_probability: Optional[float] = None
    xtc_threshold: Optional[float] = None
    n_indent: Optional[int] = None
    t_max_predict_ms: Optional[int] = None
    n_cmpl: Optional[int] = None
    response_fields: Optional[list[str]] = None

    def unused(self) -> Optional[str]:
        """The first sampler set to a value mtp-cli does not have, said in one line."""
        off = {"dynatemp_range": 0, "dry_multiplier": 0, "xtc_probability": 0, "n_indent": 0, "t_max_predict_ms": 0}
        off |= {"typical_p": 1, "mirostat": 0, "n_cmpl": 1}
        for name, value in off.items():
            if getattr(self, name) not in (None, value):
                return f"`{name}` is not supported (only {value}: off)"
        return None


def tokenize(engine: Engine, req: TokenizeRequest) -> Any:
    if lone_surrogate(req.content):
        return error(400, "`content` holds a lone surrogate (valid JSON, but not text)", param="content")
    ids = engine.rt.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
    if not req.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": _piece(engine.rt.piece(t))} for t in ids]}


def _piece(raw: bytes) -> Union[str, list[int]]:
    """A token's text, or its bytes where they are not whole UTF-8 (as llama-server gives them)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def detokenize(engine: Engine, req: DetokenizeRequest) -> Any:
    bad = [t for t in req.tokens if not 0 <= t < engine.rt.n_vocab]
    if bad:
        return error(400, f"`tokens`: {bad[0]} is outside the vocabulary (0..{engine.rt.n_vocab - 1})", param="tokens")
    return {"content": engine.rt.detokenize(req.tokens)}


def apply_template(engine: Engine, req: ChatRequest) -> Any:
    """The prompt the chat template makes of the messages (and tools), as text."""
    try:
        check(req)
        msgs, extra = req.chat_messages(), dict(req.chat_template_kwargs or {})
        tools, _ = req.tools_asked()
        if tools:
            extra["tools"] = tools
        return {"prompt": render(engine.rt.chat_file, msgs, *engine.rt.special_texts(), extra or None)}
    except (ConfigError, ChatTemplateError) as e:
        return error(400, e.spelled(lambda name: f"`{name}`"))


def props(engine: Engine, flags: dict[str, bool]) -> dict[str, Any]:
    """llama-server's GET /props: the defaults a request gets, the slots, the model and its template."""
    try:
        template: Optional[str] = template_of(engine.rt.chat_file)
    except ChatTemplateError:
        template = None
    bos, eos = engine.rt.special_texts()
    res = engine.startup
    return {
        "default_generation_settings": {"n_ctx": engine.n_ctx, "params": _settings(engine), "speculative": res.mode},
        "total_slots": engine.rt.config.n_parallel,
        "model_alias": engine.alias,
        "model_path": str(engine.rt.model_path),
        "modalities": {"vision": False, "audio": False},
        "chat_template": template,
        "bos_token": bos,
        "eos_token": eos,
        "build_info": f"mtp-cli {__version__} (llama-cpp-python)",
        "endpoint_slots": flags.get("slots", False),
        "endpoint_metrics": flags.get("metrics", False),
        "webui": flags.get("webui", False),
        "mtp": {"spec_type": res.config.spec_type, "mode": res.mode, "draft_n_max": res.config.draft_n_max},
    }


def _settings(engine: Engine) -> dict[str, Any]:
    b = engine.base
    return {
        "n_predict": b.n_predict,
        "seed": b.seed,
        "temperature": b.temp,
        "top_k": b.top_k,
        "top_p": b.top_p,
        "min_p": b.min_p,
        "repeat_penalty": b.repeat_penalty,
        "repeat_last_n": b.repeat_last_n,
        "presence_penalty": b.presence_penalty,
        "frequency_penalty": b.frequency_penalty,
        "ignore_eos": b.ignore_eos,
        "speculative.type": b.spec_type,
        "speculative.n_max": b.draft_n_max,
    }


def slots(engine: Engine) -> list[dict[str, Any]]:
    """llama-server's GET /slots, briefly: each slot's id, context share and whether it runs."""
    return [{**s, "n_ctx": engine.n_ctx, "speculative": engine.startup.mode} for s in engine.slots]


def completion_requests(engine: Engine, req: NativeRequest) -> list[CompletionRequest]:
    """The text completions the native request stands for, one per prompt (ConfigError naming what
    it cannot be)."""
    why = req.unused()
    if why:
        raise ConfigError(why)
    where = lone_surrogate(req.model_dump(exclude_none=True))
    if where:
        raise ConfigError(f"`{where}` holds a lone surrogate (valid JSON, but not text)")
    return [_one(engine, req, p) for p in prompts(engine, req.prompt)]


def _one(engine: Engine, req: NativeRequest, prompt: Union[str, list[int]]) -> CompletionRequest:
    body: dict[str, Any] = {"prompt": prompt, "n_predict": req.n_predict, "stop": req.stop}
    for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
        body[name] = getattr(req, name)
    body |= {"seed": req.seed, "ignore_eos": req.ignore_eos, "n_probs": req.n_probs or None, "grammar": req.grammar}
    body["post_sampling_probs"] = req.post_sampling_probs
    body |= {"json_schema": req.json_schema, "logit_bias": bias_ids(engine, req.logit_bias)}
    body["timings_per_token"], body["return_progress"] = req.timings_per_token, req.return_progress
    if req.repeat_last_n is not None:
        body["repeat_last_n"] = engine.n_ctx if req.repeat_last_n == -1 else req.repeat_last_n
    try:
        return CompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"`{'.'.join(str(x) for x in first.get('loc', ()))}`: {first.get('msg')}") from None


async def complete(engine: Engine, req: NativeRequest, client: Any) -> Any:
    try:
        asked = completion_requests(engine, req)
    except MtpError as e:
        return error(400, e.spelled(lambda name: f"`{name}`"))
    run = Run(engine, asked, client)
    first = await run.begin()
    if first is None:
        return error(GONE, "client closed the request")
    if isinstance(first, Failed):
        return failed(first)
    if req.stream:
        run.streaming()
        return StreamingResponse(_chunks(run, req, first), media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        done = await run.whole()
    finally:
        run.close()
    if done is None:
        return error(GONE, "client closed the request")
    if isinstance(done, Failed):
        return failed(done)
    out = [_fields(_final(engine, req, first, d, d.text, i), req.response_fields) for i, d in enumerate(done)]
    return out if len(out) > 1 else out[0]  # (one result: one object, as llama-server answers)


def _fields(doc: dict[str, Any], fields: Optional[list[str]]) -> dict[str, Any]:
    """llama-server's response_fields: only these ("a/b" is doc["a"]["b"], named "a/b")."""
    if not fields:
        return doc
    out = {}
    for name in fields:
        value: Any = doc
        for key in name.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[name] = value
    return out


def _final(engine: Engine, req: NativeRequest, first: Started, d: Done, content: str, index: int = 0) -> dict[str, Any]:
    settings = {**_settings(engine), "n_predict": _n_predict(engine, req)}
    settings |= {"seed": d.mtp.get("seed") if d.mtp.get("seed") is not None else engine.base.seed, "stream": req.stream}
    out = {
        "index": index,
        "content": content,
        "tokens": list(d.tokens) if req.return_tokens else [],
        "id_slot": d.mtp.get("slot", 0),
        "stop": True,
        "model": engine.alias,
        "tokens_predicted": d.stats.n_tokens,
        "tokens_evaluated": first.n_prompt,
        "tokens_cached": first.n_cached,
        "prompt": _prompt_text(engine, req, index),
        "generation_settings": settings,
        "has_new_line": "\n" in d.text,
        "truncated": False,
        "stop_type": "word" if d.stop_sequence else STOP_TYPE.get(d.finish_reason, "eos"),
        "stopping_word": d.stop_sequence or "",
        "timings": d.timings,
        "mtp": d.mtp,
    }
    if d.probs is not None and req.n_probs:
        out["completion_probabilities"] = _probs(d.probs, bool(req.post_sampling_probs))
    return out


def _prompt_text(engine: Engine, req: NativeRequest, index: int) -> str:
    """The prompt as text (token ids read back with their special tokens' texts)."""
    p = prompts(engine, req.prompt)[index]
    return p if isinstance(p, str) else engine.rt.detokenize(p)


def _n_predict(engine: Engine, req: NativeRequest) -> int:
    asked = req.n_predict if req.n_predict is not None and req.n_predict >= 0 else None
    server = engine.base.n_predict if engine.base.n_predict >= 0 else None
    return min(x for x in (asked, server, engine.n_ctx) if x is not None)


def _probs(probs: tuple[TokenProb, ...], post: bool) -> list[dict[str, Any]]:
    """llama-server's completion_probabilities: log-probabilities, or (post_sampling_probs) the
    probabilities the sampler chain drew from, without the tokens it left no chance."""
    if post:
        return [
            {
                **_prob_entry(p.id, p.text, p.raw, p.logprob),
                "top_probs": [_prob_entry(i, *x) for i, x in zip(p.top_ids, p.top) if math.exp(x[2]) > 0.0],
            }
            for p in probs
        ]

    def entry(i: int, text: str, raw: bytes, lp: float) -> dict[str, Any]:
        return {"id": i, "token": text, "logprob": lp, "bytes": list(raw)}

    return [
        {**entry(p.id, p.text, p.raw, p.logprob), "top_logprobs": [entry(i, *x) for i, x in zip(p.top_ids, p.top)]}
        for p in probs
    ]


def _prob_entry(i: int, text: str, raw: bytes, lp: float) -> dict[str, Any]:
    return {"id": i, "token": text, "prob": math.exp(lp), "bytes": list(raw)}


async def _chunks(run: Run, req: NativeRequest, first: Started) -> AsyncIterator[str]:
    """llama-server's native stream: a chunk per delta (its text and token ids, its prompt's index),
    then each prompt's whole record with `stop: true`."""
    engine, ended = run.engine, 0
    try:
        while ended < len(run.jobs):
            i, ev = await run.next()
            if isinstance(ev, Delta):
                doc: dict[str, Any] = {"index": i, "content": ev.text, "tokens": [p[0] for p in ev.pieces]}
                doc["stop"] = False
                if ev.probs and req.n_probs:
                    doc["completion_probabilities"] = _probs(ev.probs, bool(req.post_sampling_probs))
                if ev.timings is not None:
                    doc["timings"] = ev.timings
                yield f"data: {json.dumps(doc)}\n\n"
            elif isinstance(ev, Progress):
                doc = {"index": i, "content": "", "tokens": [], "stop": False, "prompt_progress": ev.doc()}
                if req.timings_per_token:
                    doc["timings"] = ev.timings()
                yield f"data: {json.dumps(doc)}\n\n"
            elif isinstance(ev, Done):
                ended += 1
                yield f"data: {json.dumps(_fields(_final(engine, req, first, ev, '', i), req.response_fields))}\n\n"
            elif isinstance(ev, Failed) or ev is None:
                body = failed(ev) if ev is not None else error(GONE, "client closed the request")
                yield f"data: {json.dumps(json.loads(bytes(body.body)))}\n\n"
                return
    finally:
        run.close()


__all__ = [
    "TokenizeRequest",
    "DetokenizeRequest",
    "NativeRequest",
    "tokenize",
    "detokenize",
    "apply_template",
    "props",
    "slots",
    "complete",
    "completion_requests",
]
