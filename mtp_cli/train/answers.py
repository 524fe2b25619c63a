"""The trunk's own answers to many prompts at once (BatchedAnswerer), one answerer per thread.

`n_seq` sequences share one llama.cpp context, one decode per step for all of them (a batch of b
rows costs far less than b single decodes); every decoded row yields its h row and top-k, so the
answers need no second pass. run_answerers shares the jobs among answerers, one thread each.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.sampling import RowEdits
from mtp_cli.train.data import topk_logprobs

Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # h, top-k ids, top-k log-probs, logits (a view)


def decode_rows(ctx: lx.Context, batch: lx.Batch, n_rows: int, n_embd: int, n_vocab: int, top_k: int) -> Rows:
    """Decode a batch whose every row has logits: (h rows, top-k ids, top-k log-probs, the logits
    rows: a view valid until the next decode), batch order."""
    lx.decode(ctx, batch)
    h = lx.get_embeddings_nextn(ctx, n_rows, n_embd=n_embd)
    logits = lx.logits_rows(ctx, n_rows, n_vocab)
    return (h, *topk_logprobs(logits, top_k), logits)


class BatchedAnswerer:
    """The trunk's greedy answers to many prompts at once: `n_seq` sequences share one llama.cpp
    context, one decode per step for all of them (a batch of b rows costs far less than b single
    decodes). Every decoded row yields its h row and top-k, so the answers need no second pass."""

    def __init__(
        self,
        model: lx.Model,
        *,
        max_len: int,
        top_k: int,
        n_seq: int,
        n_threads: int | None,
        temp: float = 0.0,
        seed: int = 0,
        edits_for: Callable[[str], RowEdits | None] | None = None,
    ):
        """`temp` > 0: sample each next token from the top-k at this temperature (a generator per
        sequence, seeded from `seed` and the job's key) instead of taking the greedy one.
        `edits_for(key)`: the penalties a job's answer is written under (greedy after them, as
        plain decoding with those flags writes it); the stored top-k stay the trunk's own, which is
        what a head drafts from before the same edits steer its pick."""
        if temp > 0.0 and edits_for is not None:
            raise ValueError("an answer is sampled or written under penalties, not both")
        self.model, self.max_len, self.top_k, self.n_seq = model, max_len, top_k, n_seq
        self.temp, self.seed, self.edits_for = float(temp), int(seed), edits_for
        self.ctx = lx.create_context(
            model, n_ctx=max_len * n_seq, n_batch=max(max_len, n_seq), n_seq_max=n_seq, n_threads=n_threads
        )
        lx.set_embeddings_nextn(self.ctx, True, False)
        self.E, self.V = lx.n_embd_out(model), lx.n_vocab(model)
        self.batch = lx.Batch(max(max_len, n_seq))
        self.t = 0.0
        self.n_gen = 0

    def _decode(self, n_rows: int) -> Rows:
        return decode_rows(self.ctx, self.batch, n_rows, self.E, self.V, self.top_k)

    def run(
        self,
        jobs: Iterable[tuple[str, list[int], int]],
        on_done: Callable[[str, dict], None],
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        """jobs: (key, prompt tokens, answer tokens wanted). `on_done(key, seq)` gets each finished
        sequence as arrays tokens/h/topk_id/topk_lp (prompt then answer, at most max_len rows) and
        n_prompt, in the order they finish. Stops early (dropping unfinished ones) on should_stop."""
        pending = iter(jobs)
        slots: list[dict | None] = [None] * self.n_seq
        exhausted = False
        while True:
            if should_stop and should_stop():
                return
            for s in range(self.n_seq):
                while slots[s] is None and not exhausted:
                    job = next(pending, None)
                    if job is None:
                        exhausted = True
                        break
                    slots[s] = self._start(s, *job, on_done)
            live = [s for s in range(self.n_seq) if slots[s] is not None]
            if not live:
                return
            t0 = time.perf_counter()
            b = self.batch
            b.clear()
            for s in live:
                sl = slots[s]
                assert sl is not None
                b.add(sl["next"], len(sl["tokens"]), seq_id=s, logits=True)
            h, ids, lps, logits = self._decode(len(live))
            self.t += time.perf_counter() - t0
            self.n_gen += len(live)
            for r, s in enumerate(live):
                sl = slots[s]
                assert sl is not None
                self._append(sl, sl["next"], h[r : r + 1], ids[r : r + 1], lps[r : r + 1], logits[r])
                if self._finished(sl):
                    self._finish(s, sl, on_done)
                    slots[s] = None

    def _start(
        self, s: int, key: str, ptoks: list[int], n_new: int, on_done: Callable[[str, dict], None]
    ) -> dict | None:
        """Decode a prompt into sequence s; None when it finished at once (nothing to generate)."""
        ptoks = list(ptoks)[: self.max_len]
        t0 = time.perf_counter()
        b = self.batch
        b.clear()
        for i, t in enumerate(ptoks):
            b.add(int(t), i, seq_id=s, logits=True)
        h, ids, lps, logits = self._decode(len(ptoks))
        self.t += time.perf_counter() - t0
        sl = {
            "key": key,
            "tokens": [],
            "h": [],
            "ids": [],
            "lps": [],
            "n_prompt": len(ptoks),
            "limit": min(self.max_len, len(ptoks) + max(0, n_new)),
            "edits": self.edits_for(key) if self.edits_for is not None else None,
        }
        if self.temp > 0.0:
            sl["rng"] = np.random.default_rng([self.seed, int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)])
        self._append(sl, ptoks, h, ids, lps, logits[-1])
        if self._finished(sl):
            self._finish(s, sl, on_done)
            return None
        return sl

    def _append(
        self, sl: dict, toks: int | list[int], h: np.ndarray, ids: np.ndarray, lps: np.ndarray, last: np.ndarray
    ) -> None:
        """Store rows; `last`: the logits row after the last of them (the next token's)."""
        sl["tokens"].extend([toks] if isinstance(toks, int) else toks)
        sl["h"].append(h.astype(np.float16))
        sl["ids"].append(ids)
        sl["lps"].append(lps)
        sl["next"] = self._next(sl, ids[-1], lps[-1], last)

    def _next(self, sl: dict, ids: np.ndarray, lps: np.ndarray, last: np.ndarray) -> int:
        edits: RowEdits | None = sl["edits"]
        if edits is not None and edits.active:
            row = np.array(last, dtype=np.float32)  # (a copy: the view is llama.cpp's buffer)
            edits.edit(row, sl["tokens"][-edits.last_n :] if edits.last_n > 0 else ())
            return int(row.argmax())
        if self.temp <= 0.0:
            return int(ids[0])  # greedy: the trunk's top-1 after the last row
        z = lps.astype(np.float64) / self.temp
        p = np.exp(z - z.max())
        return int(ids[sl["rng"].choice(len(ids), p=p / p.sum())])

    def _finished(self, sl: dict) -> bool:
        return len(sl["tokens"]) >= sl["limit"] or lx.is_eog(self.model, sl["next"])

    def _finish(self, s: int, sl: dict, on_done: Callable[[str, dict], None]) -> None:
        lx.memory_seq_rm(self.ctx, s, 0, -1)
        on_done(
            sl["key"],
            {
                "tokens": np.asarray(sl["tokens"], np.int32),
                "h": np.concatenate(sl["h"]),
                "topk_id": np.concatenate(sl["ids"]),
                "topk_lp": np.concatenate(sl["lps"]),
                "n_prompt": sl["n_prompt"],
                "eog": lx.is_eog(self.model, sl["next"]),
            },
        )

    def close(self) -> None:
        self.ctx.close()


def run_answerers(
    answerers: Sequence[BatchedAnswerer],
    jobs: Iterable[tuple[str, list[int], int]],
    on_done: Callable[[str, dict], None],
    should_stop: Callable[[], bool] | None = None,
) -> None:
    """Share `jobs` among the answerers, one thread each (llama_decode releases the GIL, and
    independent contexts scale where one context's threads would not). `on_done` is called from the
    worker threads, one at a time. Returns once every worker stopped; a worker's error is re-raised here.
    The caller closes the answerers, after this returns."""
    lock = threading.Lock()
    halt = threading.Event()  # a worker's error or Ctrl-C stops the others
    pending = iter(jobs)
    errors: list[BaseException] = []

    def next_job() -> Iterable[tuple[str, list[int], int]]:
        while True:
            with lock:
                job = next(pending, None)
            if job is None:
                return
            yield job

    def done(key: str, seq: dict) -> None:
        with lock:
            on_done(key, seq)

    def work(a: BatchedAnswerer) -> None:
        try:
            a.run(next_job(), done, lambda: halt.is_set() or bool(should_stop and should_stop()))
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)
            halt.set()

    workers = [threading.Thread(target=work, args=(a,), daemon=True) for a in answerers]
    try:
        for t in workers:
            t.start()
        for t in workers:
            while t.is_alive():
                t.join(0.2)  # short waits: Ctrl-C reaches this thread
    except KeyboardInterrupt:
        halt.set()
        raise
    finally:
        _join_all(workers)  # contexts and the model outlive every worker that may still be decoding
    if errors:
        raise errors[0]


def _join_all(threads: Sequence[threading.Thread]) -> None:
    """Wait for every started thread, through further Ctrl-C presses (the workers are already stopping)."""
    while any(t.is_alive() for t in threads):
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:
            continue


__all__ = ["BatchedAnswerer", "run_answerers", "decode_rows"]
