"""OpenAI's /v1/embeddings: inputs (a text, texts, token ids, lists of token ids) embedded by the
engine's worker (`serve --embeddings`), vectors as floats or base64 (little-endian float32, as
OpenAI's clients decode them)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import Field

from mtp_cli.errors import MtpError
from mtp_cli.serve.engine import Engine
from mtp_cli.serve.events import Failed
from mtp_cli.serve.jobs import Embedded, EmbedJob
from mtp_cli.serve.messages import Strict, lone_surrogate
from mtp_cli.serve.replies import error, failed

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class EmbeddingRequest(Strict):
    input: Union[str, list[str], list[int], list[list[int]]]
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)
    user: Optional[str] = None


def _inputs(engine: Engine, req: EmbeddingRequest) -> list[list[int]]:
    """Each input as token ids (texts tokenized here: the tokenizer only reads the model)."""
    raw: list[Any] = [req.input] if isinstance(req.input, str) else list(req.input)
    if raw and isinstance(raw[0], int):
        raw = [raw]
    if not raw or len(raw) > MAX_INPUTS:
        raise MtpError(f"`input` takes 1 to {MAX_INPUTS} inputs, got {len(raw)}")
    n_vocab = engine.rt.n_vocab
    out = []
    for i, x in enumerate(raw):
        if isinstance(x, str):
            if lone_surrogate(x):
                raise MtpError(f"`input.{i}` holds a lone surrogate (valid JSON, but not text)")
            out.append(engine.rt.tokenize(x, add_special=True) if x else [])
        else:
            if any(not 0 <= t < n_vocab for t in x):
                raise MtpError(f"`input.{i}` holds a token id outside the vocabulary (0..{n_vocab - 1})")
            out.append([int(t) for t in x])
    return out


async def respond(engine: Engine, req: EmbeddingRequest) -> Any:
    if engine.embedder is None:
        return error(501, "this server does not embed: start it with --embeddings", code="not_supported")
    if req.dimensions is not None and req.dimensions != engine.embedder.width:
        return error(400, f"`dimensions`: this model's embeddings have {engine.embedder.width}", param="dimensions")
    try:
        inputs = _inputs(engine, req)
    except MtpError as e:
        return error(400, e.spelled(lambda name: f"`{name}`"), param="input")
    loop = asyncio.get_running_loop()
    box: asyncio.Future[Any] = loop.create_future()

    def settle(ev: Any) -> None:
        if not box.done():
            box.set_result(ev)

    def post(ev: Any) -> None:  # (on the worker thread)
        try:
            loop.call_soon_threadsafe(settle, ev)
        except RuntimeError:  # (the loop closed: the server is shutting down)
            pass

    engine.submit(EmbedJob(inputs, post))
    got = await box
    if isinstance(got, Failed):
        return failed(got)
    assert isinstance(got, Embedded)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
        for i, v in enumerate(got.vectors)
    ]
    n = sum(len(x) for x in inputs)
    return {"object": "list", "data": data, "model": engine.alias, "usage": {"prompt_tokens": n, "total_tokens": n}}


def _encoded(v: np.ndarray, how: str) -> Any:
    if how == "base64":
        return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


__all__ = ["EmbeddingRequest", "respond"]
