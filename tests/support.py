"""Shared test helpers: a target + MTP context pair set up as llama.cpp's MTP loop does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtp_cli import llama_ext as lx

THREADS = 2


class Pair:
    """A target context plus an MTP context (own or sidecar model), set up as llama.cpp does."""

    def __init__(self, target_path: Path, draft_path: Path | None = None, *, arch: str, n_ctx: int = 256):
        self.models = []
        self.tm = lx.load_model(target_path, load_mtp=draft_path is None)
        self.models.append(self.tm)
        if draft_path is None:
            self.dm = self.tm
        else:
            self.dm = lx.load_model(draft_path, load_mtp=True)
            self.models.append(self.dm)
        n_rs = 4 if arch == "qwen35" else 0
        self.tgt = lx.create_context(self.tm, n_ctx=n_ctx, n_batch=64, n_rs_seq=n_rs, n_threads=THREADS)
        self.dft = lx.create_context(
            self.dm,
            n_ctx=n_ctx,
            n_batch=64,
            ctx_type=lx.CTX_TYPE_MTP,
            ctx_other=self.tgt,
            n_rs_seq=0,
            n_threads=THREADS,
        )
        lx.set_embeddings_nextn(self.tgt, True, False)
        lx.set_embeddings_nextn(self.dft, True, True)
        self.E = lx.n_embd_out(self.tm)

    def target_all(self, toks: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Decode `toks` from position 0 on the target: (logits [n, V], h rows [n, E])."""
        b = lx.Batch(len(toks))
        for i, t in enumerate(toks):
            b.add(t, i, logits=True)
        lx.decode(self.tgt, b)
        logits = np.stack([lx.logits_ith(self.tgt, i) for i in range(len(toks))])
        return logits, lx.get_embeddings_nextn(self.tgt, len(toks))

    def mtp_prefill(self, toks: list[int], h: np.ndarray) -> np.ndarray:
        """ARCHITECTURE §3 pairing: position p gets token x_p and the target's h row of p-1 (zeros at 0)."""
        b = lx.Batch(len(toks), self.E)
        for p, t in enumerate(toks):
            b.add(t, p, logits=True, h=h[p - 1] if p else np.zeros(self.E, np.float32))
        lx.decode(self.dft, b)
        return np.stack([lx.logits_ith(self.dft, i) for i in range(len(toks))])

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """Plain one-token-at-a-time greedy generation on a fresh target sequence."""
        lx.memory_clear(self.tgt)
        b = lx.Batch(max(len(prompt), 1))
        for i, t in enumerate(prompt):
            b.add(t, i, logits=i == len(prompt) - 1)
        lx.decode(self.tgt, b)
        out = list(prompt)
        for _ in range(n):
            nxt = int(np.argmax(lx.logits_ith(self.tgt, b.n_tokens - 1)))
            out.append(nxt)
            b.clear()
            b.add(nxt, len(out) - 1, logits=True)
            lx.decode(self.tgt, b)
        lx.memory_clear(self.tgt)
        return out

    def close(self) -> None:
        for m in self.models:
            m.close()  # (its contexts first, the MTP one before the target it reads)
