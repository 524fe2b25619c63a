"""Collecting training data through llama.cpp with the trunk frozen (rows go to a data.Store).

Teacher-forced passes over text windows (TrunkTeacher), and the trunk's own greedy answers to
prompts (BatchedAnswerer: many prompts share one context, one decode per step for all of them; one
answerer per thread, run by run_answerers). Every decoded row yields its h row and top-k.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gguf_tools.gguf_file import GGUFFile
from mtp_cli import llama_ext as lx
from mtp_cli.chat import chat_prompt
from mtp_cli.errors import ChatTemplateError
from mtp_cli.runtime import Runtime
from mtp_cli.train.data import CollectConfig, Store, is_heldout, source_key, topk_logprobs


@dataclass
class CollectProgress:
    kind: str  # "text" or "prompt"
    done: int  # sources handled so far (this run and before)
    total: int
    rows: int  # rows stored
    tokens_per_s: float  # teacher-forced rows per second of trunk decoding (this run)
    gen_tokens_per_s: float  # generated answer tokens per second (this run)


def decode_rows(
    ctx: lx.ContextPtr, batch: lx.Batch, n_rows: int, n_embd: int, n_vocab: int, top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode a batch whose every row has logits: (h rows, top-k ids, top-k log-probs), batch order."""
    lx.decode(ctx, batch)
    h = lx.get_embeddings_nextn(ctx, n_rows, n_embd=n_embd)
    return (h, *topk_logprobs(lx.logits_rows(ctx, n_rows, n_vocab), top_k))


class TrunkTeacher:
    """The frozen trunk in a llama.cpp context: teacher-forced passes return h rows and top-k."""

    def __init__(self, model: lx.ModelPtr, *, max_len: int, top_k: int, n_threads: int | None):
        self.model = model
        self.max_len, self.top_k = max_len, top_k
        self.ctx = lx.create_context(model, n_ctx=max_len, n_batch=max_len, n_threads=n_threads)
        lx.set_embeddings_nextn(self.ctx, True, False)
        self.E, self.V = lx.n_embd_out(model), lx.n_vocab(model)
        self.batch = lx.Batch(max_len)
        self.t = 0.0
        self.n = 0

    def run(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions 0..n-1 from scratch: (h (n, E), topk ids (n, K), topk log-probs (n, K))."""
        n = len(tokens)
        if not 0 < n <= self.max_len:
            raise ValueError(f"sequence of {n} tokens (1..{self.max_len})")
        t0 = time.perf_counter()
        lx.memory_clear(self.ctx)
        b = self.batch
        b.clear()
        for i, t in enumerate(tokens):
            b.add(int(t), i, logits=True)
        h, ids, lps = decode_rows(self.ctx, b, n, self.E, self.V, self.top_k)
        self.t += time.perf_counter() - t0
        self.n += n
        return h, ids, lps

    def close(self) -> None:
        lx.free_context(self.ctx)
        self.ctx = None


class BatchedAnswerer:
    """The trunk's greedy answers to many prompts at once: `n_seq` sequences share one llama.cpp
    context, one decode per step for all of them (a batch of b rows costs far less than b single
    decodes). Every decoded row yields its h row and top-k, so the answers need no second pass."""

    def __init__(
        self,
        model: lx.ModelPtr,
        *,
        max_len: int,
        top_k: int,
        n_seq: int,
        n_threads: int | None,
        temp: float = 0.0,
        seed: int = 0,
    ):
        """`temp` > 0: sample each next token from the top-k at this temperature (a generator per
        sequence, seeded from `seed` and the job's key) instead of taking the greedy one."""
        self.model, self.max_len, self.top_k, self.n_seq = model, max_len, top_k, n_seq
        self.temp, self.seed = float(temp), int(seed)
        self.ctx = lx.create_context(
            model, n_ctx=max_len * n_seq, n_batch=max(max_len, n_seq), n_seq_max=n_seq, n_threads=n_threads
        )
        lx.set_embeddings_nextn(self.ctx, True, False)
        self.E, self.V = lx.n_embd_out(model), lx.n_vocab(model)
        self.batch = lx.Batch(max(max_len, n_seq))
        self.t = 0.0
        self.n_gen = 0

    def _decode(self, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
            h, ids, lps = self._decode(len(live))
            self.t += time.perf_counter() - t0
            self.n_gen += len(live)
            for r, s in enumerate(live):
                sl = slots[s]
                assert sl is not None
                self._append(sl, sl["next"], h[r : r + 1], ids[r : r + 1], lps[r : r + 1])
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
        h, ids, lps = self._decode(len(ptoks))
        self.t += time.perf_counter() - t0
        sl = {
            "key": key,
            "tokens": [],
            "h": [],
            "ids": [],
            "lps": [],
            "n_prompt": len(ptoks),
            "limit": min(self.max_len, len(ptoks) + max(0, n_new)),
        }
        if self.temp > 0.0:
            sl["rng"] = np.random.default_rng([self.seed, int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)])
        self._append(sl, ptoks, h, ids, lps)
        if self._finished(sl):
            self._finish(s, sl, on_done)
            return None
        return sl

    def _append(self, sl: dict, toks: int | list[int], h: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        sl["tokens"].extend([toks] if isinstance(toks, int) else toks)
        sl["h"].append(h.astype(np.float16))
        sl["ids"].append(ids)
        sl["lps"].append(lps)
        sl["next"] = self._next(sl, ids[-1], lps[-1])

    def _next(self, sl: dict, ids: np.ndarray, lps: np.ndarray) -> int:
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
        lx.free_context(self.ctx)
        self.ctx = None


def text_windows(model: lx.ModelPtr, docs: Iterable[str], max_len: int) -> Iterable[tuple[str, list[int]]]:
    """(source key, tokens) windows of at most max_len tokens (at least 16) over each document."""
    for doc in docs:
        toks = lx.tokenize(model, doc, add_special=True)
        base = source_key("text", doc)
        for w, a in enumerate(range(0, len(toks), max_len)):
            win = toks[a : a + max_len]
            if len(win) >= 16:
                yield f"{base}:{w}", win


def collect(
    model_path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    texts: Sequence[str] = (),
    prompts: Sequence[str] = (),
    cfg: CollectConfig = CollectConfig(),
    progress: Callable[[CollectProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Store:
    """Teacher-forced passes over `texts` (documents), then the trunk's greedy answers to `prompts`
    (BatchedAnswerer: one per thread, n_seq prompts each), every row stored in the store at `root`.
    Sources already in the store are skipped (resume); a stop drops only unfinished answers. Returns
    the store."""
    with Runtime(model_path, spec_type="none") as rt:
        store = Store.create(
            root, n_embd=lx.n_embd_out(rt.model), top_k=cfg.top_k, n_vocab=lx.n_vocab(rt.model), model=str(model_path)
        )
        run = _Collection(rt, store, cfg, progress, should_stop)
        try:
            windows = list(text_windows(rt.model, texts, cfg.max_len))
            run.total = len(windows) + len(prompts)
            if run.texts(windows):
                run.answers(prompts)
        finally:
            store.flush()
            run.close()
    return store


class _Collection:
    """One collection run: its trunk contexts, the count of sources handled, progress reports."""

    def __init__(
        self,
        rt: Runtime,
        store: Store,
        cfg: CollectConfig,
        progress: Callable[[CollectProgress], None] | None,
        should_stop: Callable[[], bool] | None,
    ):
        self.rt, self.store, self.cfg, self.progress, self.should_stop = rt, store, cfg, progress, should_stop
        self.teacher: TrunkTeacher | None = None
        self.answerers: list[BatchedAnswerer] = []
        self.done = self.total = 0
        gf: GGUFFile = rt.file
        self.chat = cfg.chat if cfg.chat is not None else isinstance(gf.get("tokenizer.chat_template"), str)

    def split(self, key: str) -> str:
        return "heldout" if is_heldout(key, self.cfg.seed, self.cfg.heldout) else "train"

    def report(self, kind: str) -> None:
        if self.progress:
            t_gen = max((a.t for a in self.answerers), default=0.0)
            n_gen = sum(a.n_gen for a in self.answerers)
            t = self.teacher
            tf = t.n / t.t if t is not None and t.t else 0.0
            self.progress(
                CollectProgress(kind, self.done, self.total, self.store.n_rows, tf, n_gen / t_gen if t_gen else 0.0)
            )

    def texts(self, windows: Sequence[tuple[str, list[int]]]) -> bool:
        """Teacher-forced passes over the windows not stored yet; False if told to stop."""
        cfg = self.cfg
        for key, toks in windows:
            if self.should_stop and self.should_stop():
                return False
            if not self.store.done(key):
                if self.teacher is None:
                    self.teacher = TrunkTeacher(
                        self.rt.model, max_len=cfg.max_len, top_k=cfg.top_k, n_threads=cfg.n_threads
                    )
                h, ids, lps = self.teacher.run(toks)
                self.store.append(key, "text", self.split(key), np.asarray(toks), h, ids, lps)
            self.done += 1
            self.report("text")
        return True

    def _jobs(self, prompts: Sequence[str]) -> Iterable[tuple[str, list[int], int]]:
        cfg, seen = self.cfg, set()
        bos, eos = self.rt.special_texts()
        for p in prompts:
            key = source_key("prompt", p)
            if self.store.done(key) or key in seen:  # (a repeated prompt is answered once)
                self.done += 1
                continue
            seen.add(key)
            text = p
            if self.chat:
                try:
                    text = chat_prompt(self.rt.file, p, bos, eos)
                except ChatTemplateError:
                    self.chat = False
            ptoks = self.rt.tokenize(text, add_special=True, parse_special=self.chat)[: cfg.max_len - 8]
            yield key, ptoks, min(cfg.max_new, cfg.max_len - len(ptoks))

    def _finished(self, key: str, seq: dict) -> None:  # (run_answerers calls it under its lock)
        self.store.append(
            key,
            "prompt",
            self.split(key),
            seq["tokens"],
            seq["h"],
            seq["topk_id"],
            seq["topk_lp"],
            n_prompt=seq["n_prompt"],
        )
        self.done += 1
        self.report("prompt")

    def answers(self, prompts: Sequence[str]) -> None:
        """The trunk's answers to the prompts not stored yet: one answerer per thread, each with its
        own context and one llama.cpp thread."""
        cfg = self.cfg
        if prompts:
            self.answerers = [
                BatchedAnswerer(self.rt.model, max_len=cfg.max_len, top_k=cfg.top_k, n_seq=cfg.n_seq, n_threads=1)
                for _ in range(max(1, cfg.n_threads or 1))
            ]
        run_answerers(self.answerers, self._jobs(prompts), self._finished, self.should_stop)

    def close(self) -> None:
        for a in self.answerers:
            a.close()
        if self.teacher is not None:
            self.teacher.close()


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


__all__ = [
    "CollectProgress",
    "TrunkTeacher",
    "BatchedAnswerer",
    "collect",
    "run_answerers",
    "decode_rows",
    "text_windows",
]
