"""One model, one worker thread: requests become Jobs in a FIFO, and the worker runs them one decode
at a time (a llama context is not thread-safe), reporting each as Events through the job's `emit`
(called from the worker thread: the HTTP layer hands them to its event loop).

A job's events: Started (the prompt checked and its cached share known), then Delta texts, then
Done; or Failed at any point. A job whose `cancelled` is set stops at its next token.

The KV cache keeps what the last request left (mtp_cli.session): a request decodes only what its
prompt does not share with it (a follow-up turn, a regenerated answer, an edited last turn, a shared
system prompt), and reports the rest as cached tokens.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from mtp_cli import drafters
from mtp_cli.config import GenConfig
from mtp_cli.errors import ChatTemplateError, ConfigError, MtpError
from mtp_cli.runtime import Runtime
from mtp_cli.serve.requests import ChatRequest, CompletionRequest, check
from mtp_cli.session import Prompt, Session
from mtp_cli.speed.auto import AutoDraft, Resolved
from mtp_cli.stats import Generation, GenStats, TokenEvent

log = logging.getLogger(__name__)

FINISH = {"eog": "stop", "n_predict": "length", "ctx_full": "length"}  # GenStats.stop_reason -> OpenAI's


class ContextLengthError(ConfigError):
    """The prompt, or the prompt and max_tokens, do not fit the context."""


@dataclass(frozen=True)
class Started:
    n_prompt: int
    n_cached: int


@dataclass(frozen=True)
class TokenProb:
    """One generated token's log-probability and its most likely alternatives', as text and bytes."""

    text: str
    raw: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...]


@dataclass(frozen=True)
class Delta:
    text: str
    probs: tuple[TokenProb, ...] = ()  # (the tokens since the last delta, when log-probabilities are asked)


@dataclass(frozen=True)
class Done:
    text: str
    finish_reason: str  # stop | length
    stats: GenStats
    mtp: dict[str, Any]
    timings: dict[str, Any]
    probs: Optional[tuple[TokenProb, ...]] = None  # (every token's, when log-probabilities are asked)


@dataclass(frozen=True)
class Failed:
    error: BaseException
    status: int  # 400 for a request mtp-cli refuses, 500 for its own failure


Event = Union[Started, Delta, Done, Failed]


@dataclass
class Job:
    request: Union[ChatRequest, CompletionRequest]
    emit: Callable[[Event], None]
    id: str = field(default_factory=lambda: "req-" + secrets.token_hex(6))
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Record:
    """What one finished request did (the log line; the last few are kept for /health and tests)."""

    id: str
    n_prompt: int
    n_cached: int
    n_tokens: int
    tokens_per_second: float
    acceptance: float
    stop_reason: str
    mode: str
    n_max: int


class Engine:
    """The server's model: `submit` jobs from any thread; one worker thread runs them in order."""

    def __init__(self, rt: Runtime, base: GenConfig, alias: Optional[str] = None):
        self.rt, self.base = rt, base
        self.alias = alias or rt.model_path.name
        self.auto = AutoDraft(rt)
        self.startup: Resolved = self.auto.resolve(drafters.validated(base))  # a bad setting fails before serving
        self.n_ctx = rt.contexts(self.startup.config)[0].n_ctx
        rt.longest_token  # noqa: B018  (computed now, not in the first request)
        self.created = int(os.path.getmtime(rt.model_path))
        self.recent: deque[Record] = deque(maxlen=64)
        self._jobs: queue.Queue[Optional[Job]] = queue.Queue()
        self.session = Session(rt)
        self._current: Optional[Job] = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name="mtp-serve-worker", daemon=True)

    @classmethod
    def load(cls, model: Union[str, os.PathLike[str]], base: GenConfig, alias: Optional[str] = None) -> Engine:
        rt = Runtime.load(model, base)
        try:
            return cls(rt, base, alias)
        except BaseException:
            rt.close()
            raise

    # -- the queue -----------------------------------------------------------------------------

    def start(self) -> Engine:
        self._thread.start()
        return self

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def cancel_all(self) -> None:
        """Stop the running job at its next token and drop the queued ones (the server is stopping)."""
        self._closing.set()
        current = self._current
        if current is not None:  # (its stream ends with an error chunk and [DONE], not cut off)
            current.emit(Failed(MtpError("the server is shutting down"), 503))
            current.cancelled.set()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancelled.set()
                job.emit(Failed(MtpError("the server is shutting down"), 503))

    def close(self) -> None:
        """Stop every job, let the worker finish, then free the model (not while it may still decode)."""
        self.cancel_all()
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        if self._thread.is_alive():
            log.warning("the worker is still decoding: the model is left to the process's exit")
            return
        self.rt.close()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if job.cancelled.is_set() or self._closing.is_set():
                continue  # (its client left while it waited, or the server is stopping)
            self._current = job
            try:
                self._run(job)
            except (ConfigError, ChatTemplateError) as e:  # the request's fault
                job.emit(Failed(e, 400))
            except Exception as e:  # mtp-cli's or llama.cpp's: no request can stop the worker
                log.exception("%s: failed", job.id)
                job.emit(Failed(e, 500))
            finally:
                self._current = None

    # -- one job -------------------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        req = job.request
        check(req)
        self._check_size(req.texts_size())
        cfg = replace(self.base, **req.overrides())
        if not cfg.greedy and cfg.seed < 0:
            cfg = replace(cfg, seed=secrets.randbits(31))  # random, but said: the request can be repeated
        prompt = self._prompt(req)
        n_prompt = len(prompt.tokens)
        if n_prompt >= self.n_ctx:
            raise ContextLengthError(f"the prompt has {n_prompt} tokens and the context holds {self.n_ctx}: shorten it")
        if cfg.n_predict > self.n_ctx - n_prompt:  # (as llama-server: stop at the context's end, "length")
            cfg = replace(cfg, n_predict=self.n_ctx - n_prompt)
        res = self.auto.resolve(cfg)
        gen = self.session.generate(prompt, res.config, res.policy)
        job.emit(Started(n_prompt, gen.stats.n_cached))
        text, cut, probs = _stream(gen, job, req.stop_strings(), self._prob)
        st = gen.stats
        rec = Record(
            job.id,
            st.n_prompt,
            st.n_cached,
            st.n_tokens,
            st.tokens_per_second,
            st.acceptance,
            "stop string" if cut else str(st.stop_reason),
            res.mode,
            st.n_max,
        )
        self.recent.append(rec)
        _log(rec, st.spec_type)
        if not job.cancelled.is_set():
            finish = "stop" if cut else FINISH.get(str(st.stop_reason), "stop")
            asked = res.config.logprobs is not None
            job.emit(Done(text, finish, st, _figures(st, res, cfg), timings(st), probs if asked else None))

    def _prob(self, ev: TokenEvent) -> TokenProb:
        def said(token: int) -> tuple[str, bytes]:
            raw = self.rt.piece(token)
            return raw.decode("utf-8", "replace"), raw

        alts = tuple((*said(t), lp) for t, lp in ev.top)
        return TokenProb(*said(ev.token), float(ev.logprob or 0.0), alts)

    def _check_size(self, n_chars: int) -> None:
        """Refuse a prompt text too long for the context before tokenizing it (each token covers at
        most the vocabulary's longest entry)."""
        at_least = n_chars // self.rt.longest_token
        if at_least >= self.n_ctx:
            raise ContextLengthError(
                f"the prompt has {n_chars} characters, at least {at_least} tokens, and the context "
                f"holds {self.n_ctx}: shorten it"
            )

    def _prompt(self, req: Union[ChatRequest, CompletionRequest]) -> Prompt:
        if isinstance(req, ChatRequest):
            return self.session.chat(req.chat_messages())
        text = req.prompt_text()
        return self.session.ids(req.prompt_ids()) if text is None else self.session.text(text)


def _stream(
    gen: Generation, job: Job, stops: list[str], prob: Callable[[TokenEvent], TokenProb]
) -> tuple[str, bool, tuple[TokenProb, ...]]:
    """Run the generation, emitting text as it comes (holding back what could begin a stop string);
    (the text, whether a stop string cut it, the tokens' log-probabilities when asked)."""
    out, sent, cut = "", 0, False
    probs: list[TokenProb] = []
    told = 0  # (probs already sent with a delta)
    hold = max((len(s) for s in stops), default=1) - 1
    try:
        for ev in gen:
            if job.cancelled.is_set():
                break
            if ev.logprob is not None:
                probs.append(prob(ev))
            lo = max(0, len(out) - hold)
            out += ev.text
            if stops:
                found = [i for s in stops if (i := out.find(s, lo)) >= 0]
                if found:
                    out, cut = out[: min(found)], True
                    break
            upto = len(out) - hold
            if upto > sent:
                job.emit(Delta(out[sent:upto], tuple(probs[told:])))
                sent, told = upto, len(probs)
    finally:
        gen.close()
    if (len(out) > sent or len(probs) > told) and not job.cancelled.is_set():
        job.emit(Delta(out[sent:], tuple(probs[told:])))
    return out, cut, tuple(probs)


def _figures(st: GenStats, res: Resolved, cfg: GenConfig) -> dict[str, Any]:
    """The response's `mtp` object: what drafting did for this request."""
    doc: dict[str, Any] = {
        "spec_type": st.spec_type,
        "mode": res.mode,
        "draft_n_max": st.n_max,
        "verify_passes": st.n_verify,
        "drafted": st.n_drafted,
        "accepted": st.n_accepted,
        "acceptance": round(st.acceptance, 4),
        "acceptance_by_pos": [round(x, 4) for x in st.acceptance_by_pos],
        "tokens_per_pass": round(st.tokens_per_pass, 4),
        "tokens_per_second": round(st.tokens_per_second, 2),
        "prompt_tokens_per_second": round(st.prompt_tokens_per_second, 2),
        "seed": None if cfg.greedy else cfg.seed,
    }
    if res.policy is not None:
        doc["adaptive"] = res.policy.summary()
    return doc


def timings(st: GenStats) -> dict[str, Any]:
    """llama-server's `timings` object (front-ends written for it read acceptance from here)."""
    n_prompt, n_gen = st.n_prompt - st.n_cached, st.n_tokens
    prompt_ms, gen_ms = st.t_prompt * 1e3, st.t_gen * 1e3
    return {
        "cache_n": st.n_cached,
        "prompt_n": n_prompt,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / n_prompt, 3) if n_prompt else 0.0,
        "prompt_per_second": round(st.prompt_tokens_per_second, 3),
        "predicted_n": n_gen,
        "predicted_ms": round(gen_ms, 3),
        "predicted_per_token_ms": round(gen_ms / (n_gen - st.n_first), 3) if n_gen > st.n_first else 0.0,
        "predicted_per_second": round(st.tokens_per_second, 3),
        "draft_n": st.n_drafted,
        "draft_n_accepted": st.n_accepted,
    }


def _log(r: Record, spec_type: str) -> None:
    log.info(
        "%s: %d prompt tokens (%d cached), %d generated at %.1f t/s, %s%s, %s",
        r.id,
        r.n_prompt,
        r.n_cached,
        r.n_tokens,
        r.tokens_per_second,
        spec_type,
        f" N={r.n_max} ({r.mode}) acceptance {r.acceptance:.1%}" if spec_type != "none" else "",
        r.stop_reason,
    )


def model_info(engine: Engine) -> dict[str, Any]:
    """The /v1/models entry of the served model."""
    return {"id": engine.alias, "object": "model", "created": engine.created, "owned_by": "mtp-cli"}


def now() -> int:
    return int(time.time())


__all__ = [
    "Engine",
    "Job",
    "Started",
    "Delta",
    "Done",
    "Failed",
    "Event",
    "Record",
    "ContextLengthError",
    "model_info",
]
