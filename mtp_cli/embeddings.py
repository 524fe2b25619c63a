"""Pooled embeddings of texts from a loaded model (`serve --embeddings`): a context of their own
beside the generation's (embeddings on, one pooling: mean, cls or last), each input decoded alone
and its vector scaled to unit length, as llama-server's /v1/embeddings returns them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.errors import ConfigError


class Embedder:
    """`embed(token lists)` -> unit vectors, on the thread that made it (a llama context is not
    thread-safe). Close it to free its context."""

    def __init__(self, model: lx.Model, n_ctx: int, pooling: str = "mean", n_threads: int | None = None):
        if pooling not in lx.POOLING:
            raise ConfigError(f"`pooling` takes {', '.join(lx.POOLING)}, got {pooling!r}")
        self.n_ctx, self.pooling = int(n_ctx), pooling
        self.width = lx.n_embd_out(model)
        # (the whole input in one micro-batch: a pooled row is the pooling of one ubatch's rows)
        self.ctx = lx.create_context(
            model,
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_ubatch=n_ctx,
            n_threads=n_threads,
            embeddings=True,
            pooling=lx.POOLING[pooling],
        )
        self.batch = lx.Batch(self.n_ctx)

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One unit vector per input (token ids); ConfigError naming an input that is empty or too long."""
        for i, ids in enumerate(inputs):
            if not ids:
                raise ConfigError(f"`input.{i}` is empty")
            if len(ids) > self.n_ctx:
                raise ConfigError(f"`input.{i}` has {len(ids)} tokens and the embedding context holds {self.n_ctx}")
        out = []
        for ids in inputs:
            lx.memory_clear(self.ctx, data=False)
            self.batch.clear()
            self.batch.add_many(np.asarray(ids, dtype=np.int32), 0)
            self.batch.logits[: len(ids)] = 1  # (every row an output: the pooling reads them all)
            lx.decode(self.ctx, self.batch)
            v = lx.embeddings_seq(self.ctx, 0, self.width)
            norm = float(np.linalg.norm(v))
            out.append(v / norm if norm > 0 else v)
        return out

    def close(self) -> None:
        self.ctx.close()


__all__ = ["Embedder"]
