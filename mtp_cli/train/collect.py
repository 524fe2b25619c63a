"""Collecting training data through llama.cpp with the trunk frozen (rows go to a data.Store).

Teacher-forced passes over text windows (TrunkTeacher), and the trunk's own greedy answers to
prompts (BatchedAnswerer: many prompts share one context, one decode per step for all of them; one
answerer per thread, run by run_answerers). Every decoded row yields its h row and top-k.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mtp_cli import llama_ext as lx
from mtp_cli.chat import chat_prompt
from mtp_cli.config import GenConfig
from mtp_cli.errors import ChatTemplateError
from mtp_cli.runtime import Runtime
from mtp_cli.sampling import RowEdits
from mtp_cli.train.answers import BatchedAnswerer, decode_rows, run_answerers
from mtp_cli.train.data import CollectConfig, Store, is_heldout, source_key


@dataclass
class CollectProgress:
    kind: str  # "text" or "prompt"
    done: int  # sources handled so far (this run and before)
    total: int
    rows: int  # rows stored
    tokens_per_s: float  # teacher-forced rows per second of trunk decoding (this run)
    gen_tokens_per_s: float  # generated answer tokens per second (this run)
    before: int = 0  # sources an earlier run had stored already (skipped by this one)
    budget_s: float = math.inf  # seconds this run may collect (from its `deadline`)

    @property
    def fraction(self) -> float:
        """This run's share of the sources left to it, 0..1 (it may stop earlier, at its deadline)."""
        left = self.total - self.before
        return (self.done - self.before) / left if left > 0 else 1.0


class TrunkTeacher:
    """The frozen trunk in a llama.cpp context: teacher-forced passes return h rows and top-k."""

    def __init__(self, model: lx.Model, *, max_len: int, top_k: int, n_threads: int | None):
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
        h, ids, lps, _ = decode_rows(self.ctx, b, n, self.E, self.V, self.top_k)
        self.t += time.perf_counter() - t0
        self.n += n
        return h, ids, lps

    def close(self) -> None:
        self.ctx.close()


def text_windows(model: lx.Model, docs: Iterable[str], max_len: int) -> Iterable[tuple[str, list[int]]]:
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
    deadline: float | None = None,
) -> Store:
    """Teacher-forced passes over `texts` (documents), then the trunk's greedy answers to `prompts`
    (BatchedAnswerer: one per thread, n_seq prompts each), every row stored in the store at `root`,
    until `deadline` (time.monotonic()) if one is given. Sources already in the store are skipped
    (resume); a stop drops only unfinished answers. Returns the store."""
    t0 = time.monotonic()
    budget = deadline - t0 if deadline is not None else math.inf

    def stop() -> bool:
        return (deadline is not None and time.monotonic() >= deadline) or bool(should_stop and should_stop())

    with Runtime.load(model_path) as rt:
        store = Store.create(
            root,
            n_embd=lx.n_embd_out(rt.model),
            top_k=cfg.top_k,
            n_vocab=lx.n_vocab(rt.model),
            model=str(model_path),
            penalties=cfg.penalties,
        )
        run = _Collection(rt, store, cfg, progress, stop)
        try:
            windows = list(text_windows(rt.model, texts, cfg.max_len))
            keys = set([k for k, _ in windows] + [source_key("prompt", p) for p in prompts])  # (repeats done once)
            run.total, run.budget_s = len(keys), budget
            run.before = run.done = sum(map(store.done, keys))
            run.report("text" if windows else "prompt")  # (the bar shows before the first source is done)
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
        self.done = self.total = self.before = 0
        self.budget_s = math.inf
        gf = rt.chat_file
        self.chat = cfg.chat if cfg.chat is not None else isinstance(gf.get("tokenizer.chat_template"), str)

    def split(self, key: str) -> str:
        return "heldout" if is_heldout(key, self.cfg.seed, self.cfg.heldout) else "train"

    def report(self, kind: str) -> None:
        if self.progress:
            t_gen = max((a.t for a in self.answerers), default=0.0)
            n_gen = sum(a.n_gen for a in self.answerers)
            t = self.teacher
            tf = t.n / t.t if t is not None and t.t else 0.0
            gen = n_gen / t_gen if t_gen else 0.0
            self.progress(
                CollectProgress(kind, self.done, self.total, self.store.n_rows, tf, gen, self.before, self.budget_s)
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
                continue
            seen.add(key)
            text = p
            if self.chat:
                try:
                    text = chat_prompt(self.rt.chat_file, p, bos, eos)
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
                BatchedAnswerer(
                    self.rt.model,
                    max_len=cfg.max_len,
                    top_k=cfg.top_k,
                    n_seq=cfg.n_seq,
                    n_threads=1,
                    edits_for=self.edits_for,
                )
                for _ in range(max(1, cfg.n_threads or 1))
            ]
        run_answerers(self.answerers, self._jobs(prompts), self._finished, self.should_stop)

    def edits_for(self, key: str) -> RowEdits | None:
        """The penalties a prompt's answer is written under: one of cfg.penalties, by the prompt's key."""
        ps = self.cfg.penalties
        if not ps:
            return None
        r, f, p = ps[int(hashlib.sha1(f"{self.cfg.seed}:{key}".encode()).hexdigest()[:8], 16) % len(ps)]
        edits = RowEdits(GenConfig(repeat_penalty=r, frequency_penalty=f, presence_penalty=p), ())
        return edits if edits.active else None

    def close(self) -> None:
        for a in self.answerers:
            a.close()
        if self.teacher is not None:
            self.teacher.close()


__all__ = [
    "CollectProgress",
    "TrunkTeacher",
    "BatchedAnswerer",
    "collect",
    "run_answerers",
    "decode_rows",
    "text_windows",
]
