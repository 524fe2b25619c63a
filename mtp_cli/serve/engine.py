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
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from mtp_cli import drafters
from mtp_cli import llama_ext as lx
from mtp_cli.chat import render, template_of
from mtp_cli.config import GenConfig, LoadConfig
from mtp_cli.embeddings import Embedder
from mtp_cli.errors import ChatTemplateError, ConfigError, MtpError
from mtp_cli.policy import NoDrafts
from mtp_cli.runtime import Runtime
from mtp_cli.serve.events import (
    FINISH,
    Delta,
    Done,
    Failed,
    Started,
    Streamed,
    TokenProb,
    draft_n_max,
    figures,
    reporter,
    stream,
    timings,
)
from mtp_cli.serve.jobs import Begun, Embedded, EmbedJob, Job, Request
from mtp_cli.serve.metrics import Metrics
from mtp_cli.serve.reasoning import opens_thinking
from mtp_cli.serve.requests import ChatRequest, check
from mtp_cli.serve.slots import SlotWorker
from mtp_cli.serve.tools import FORMATS, ToolFormat, ToolPlan, format_of, generic_messages, plan
from mtp_cli.session import Prompt, Session
from mtp_cli.speed.auto import AutoDraft, Resolved
from mtp_cli.stats import GenStats, TokenEvent

log = logging.getLogger(__name__)


class ContextLengthError(ConfigError):
    """The prompt, or the prompt and max_tokens, do not fit the context."""


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

    def __init__(self, rt: Runtime, base: GenConfig, alias: Optional[str] = None, embeddings: Optional[str] = None):
        self.rt, self.base = rt, base
        self.aliases = sorted({a.strip() for a in (alias or "").split(",") if a.strip()})  # (-a a,b: "a" answers)
        self.alias = self.aliases[0] if self.aliases else rt.model_path.name
        self.tags: list[str] = []  # (--tags: informational)
        self.reasoning_format = "auto"  # (--reasoning-format: a chat request's default)
        self.auto = AutoDraft(rt)
        self.startup: Resolved = self.auto.resolve(drafters.validated(base))  # a bad setting fails before serving
        ctxs = rt.contexts(self.startup.config)[0]
        self.n_ctx, self.flash_attn = ctxs.n_ctx, ctxs.key.kv.flash_attn  # (None: llama.cpp's auto)
        rt.longest_token  # noqa: B018  (computed now, not in the first request)
        self.created = int(os.path.getmtime(rt.model_path))
        self.recent: deque[Record] = deque(maxlen=64)
        self.metrics = Metrics()
        self._jobs: queue.Queue[Union[Job, EmbedJob, None]] = queue.Queue()
        # (`embeddings`: the pooling of /v1/embeddings, from a context of its own; None: no embeddings)
        self.embedder = Embedder(rt.model, self.n_ctx, embeddings, base.n_threads) if embeddings else None
        self.session = Session(rt)
        self.tool_format, self.knows_tools = _tool_format(rt)
        self._active: dict[int, Job] = {}  # by slot: the jobs running
        self._closing = threading.Event()
        self._go = threading.Event()  # start(): the worker thread that loaded the model takes jobs
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def load(
        cls,
        model: Union[str, os.PathLike[str]],
        base: GenConfig,
        alias: Optional[str] = None,
        *,
        load: Optional[LoadConfig] = None,
        embeddings: Optional[str] = None,
    ) -> Engine:
        """The model loaded (by `load`; without one, for base's spec type) and served with `base`, by
        the worker thread that will run every job: llama.cpp's computing stays on the thread that
        loaded the model. (Built with OpenMP, llama.cpp gives each calling thread a team of its own,
        and libgomp, seeing more threads than cores, stops spinning at the graph's barriers: decoding
        on another thread than the loading one was 6x slower on 2 cores.)"""
        box: queue.Queue[Union[Engine, BaseException]] = queue.Queue()

        def boot() -> None:
            try:
                rt = Runtime.load(model, load or LoadConfig(spec_type=base.spec_type))
                try:
                    engine = cls(rt, base, alias, embeddings)
                except BaseException:
                    rt.close()
                    raise
            except BaseException as e:  # (raised again by the caller)
                box.put(e)
                return
            engine._thread = threading.current_thread()
            box.put(engine)
            engine._go.wait()
            engine._serve()

        threading.Thread(target=boot, name="mtp-serve-worker", daemon=True).start()
        got = box.get()
        if isinstance(got, BaseException):
            raise got
        return got

    # -- the queue -----------------------------------------------------------------------------

    def start(self) -> Engine:
        """Take jobs (on the loading thread; a new one for an engine built on a runtime given)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="mtp-serve-worker", daemon=True)
            self._thread.start()
        self._go.set()
        return self

    def _serve(self) -> None:
        (SlotWorker(self).run if self.rt.config.n_parallel > 1 else self._work)()

    def submit(self, job: Union[Job, EmbedJob]) -> None:
        self._jobs.put(job)

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    @property
    def slots_busy(self) -> list[int]:
        return list(self._active)

    @property
    def slots(self) -> list[dict[str, Any]]:
        """Each slot: its id and whether a request runs in it (llama-server's /slots, briefly)."""
        busy = dict(self._active)
        return [
            {"id": s, "is_processing": s in busy, "id_task": busy[s].id if s in busy else None}
            for s in range(self.rt.config.n_parallel)
        ]

    def cancel_all(self) -> None:
        """Stop the running jobs at their next token and drop the queued ones (the server is stopping)."""
        self._closing.set()
        for current in list(self._active.values()):  # (its stream ends with an error chunk and [DONE], not cut off)
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
        self._go.set()  # (a worker never started ends at once)
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=60)
        if self._thread is not None and self._thread.is_alive():
            log.warning("the worker is still decoding: the model is left to the process's exit")
            return
        if self.embedder is not None:
            self.embedder.close()
        self.rt.close()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if job.cancelled.is_set() or self._closing.is_set():
                self.skip(job)
                continue
            if isinstance(job, EmbedJob):
                self.embed(job)
                continue
            self._active[0] = job
            try:
                self._run(job)
            except (ConfigError, ChatTemplateError) as e:  # the request's fault
                job.emit(Failed(e, 400))
            except Exception as e:  # mtp-cli's or llama.cpp's: no request can stop the worker
                log.exception("%s: failed", job.id)
                job.emit(Failed(e, 500))
            finally:
                self._active.pop(0, None)

    def skip(self, job: Union[Job, EmbedJob]) -> None:
        """A job not run: its client left while it waited (nobody to tell), or the server is stopping."""
        if self._closing.is_set() and not job.cancelled.is_set():
            job.cancelled.set()
            job.emit(Failed(MtpError("the server is shutting down"), 503))

    def embed(self, job: EmbedJob) -> None:
        """Run an embedding job (on the worker, between generation steps)."""
        try:
            if self.embedder is None:
                raise ConfigError("this server does not embed: start it with --embeddings")
            t0 = time.perf_counter()
            vectors = self.embedder.embed(job.inputs)
            self.metrics.add_prompt(sum(len(x) for x in job.inputs), time.perf_counter() - t0)
            job.emit(Embedded(vectors))
        except ConfigError as e:
            job.emit(Failed(e, 400))
        except Exception as e:
            log.exception("%s: failed", job.id)
            job.emit(Failed(e, 500))

    # -- one job -------------------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        st = self.begin(job, self.session)
        report = reporter(job) if st.req.return_progress else None
        gen = self.session.generate(st.prompt, st.res.config, st.res.policy, report)
        job.emit(Started(len(st.prompt.tokens), gen.stats.n_cached, st.thinking, st.prompt_text))
        out = stream(gen, job, st.req.stop_strings(), self._prob, st.held, bool(st.req.timings_per_token))
        self.finish(st, out, gen.stats)

    def opens_thinking(self, prompt: Prompt) -> bool:
        """A chat prompt ends inside a thinking block its template opened: the answer begins with reasoning."""
        return prompt.messages is not None and opens_thinking(lx.spelled(self.rt.model, prompt.tokens[-16:]))

    def begin(self, job: Job, session: Session, auto: Optional[AutoDraft] = None) -> Begun:
        """A job checked, its prompt (from `session`: what its memory holds) and its settings."""
        req = job.request
        check(req)
        self._check_size(req.texts_size())
        tools = self._tool_plan(req)
        prompt = self._prompt(req, tools, session)
        res = (auto or self.auto).resolve(self._config(req, tools, len(prompt.tokens)))
        if req.spec_n_max is not None and req.spec_n_max <= 0:  # (drafts off, at the N that keeps the contexts)
            res = replace(res, policy=NoDrafts(res.config.draft_n_max), mode="fixed")
        shown = lx.spelled(self.rt.model, prompt.tokens) if getattr(req, "verbose", None) else None
        return Begun(job, req, tools, prompt, res, self.opens_thinking(prompt), shown)

    def finish(self, b: Begun, out: Streamed, st: GenStats, slot: int = 0) -> None:
        """The job's generation ended with this text (TextStream.close): its record, and Done."""
        job, tools, res = b.job, b.tools, b.res
        text, cut, probs, sent, tokens = out
        content, calls = b.parse(text) if tools and not cut else (text, [])
        if not calls and len(content) > sent and not job.cancelled.is_set():
            job.emit(Delta(content[sent:]))  # (held back as a possible call, and none was)
        rec = Record(
            job.id,
            st.n_prompt,
            st.n_cached,
            st.n_tokens,
            st.tokens_per_second,
            st.acceptance,
            "stop string" if cut else "tool calls" if calls else str(st.stop_reason),
            res.mode,
            draft_n_max(st, res),
        )
        self.recent.append(rec)
        self.metrics.add(st, batched=self.rt.config.n_parallel > 1)
        _log(rec, st.spec_type)
        if not job.cancelled.is_set():
            finish = "stop" if cut else "tool_calls" if calls else FINISH.get(str(st.stop_reason), "stop")
            lps = probs if res.config.logprobs is not None else None
            mtp = {**figures(st, res, res.config), "slot": slot}
            job.emit(Done(content, finish, st, mtp, timings(st), lps, tuple(calls), cut, tokens))

    def count(self, req: Request) -> int:
        """The tokens of the request's prompt, rendered whole (no generation; any thread: the
        template and the tokenizer only read the model)."""
        check(req)
        self._check_size(req.texts_size())
        return len(self._prompt(req, self._tool_plan(req), Session(self.rt)).tokens)

    def _config(self, req: Request, tools: Optional[ToolPlan], n_prompt: int) -> GenConfig:
        """The request's settings over the server's: a random seed drawn (and said), a forced tool
        call's grammar, max_tokens clamped to the room the prompt leaves (as llama-server: "length")."""
        cfg = replace(self.base, **req.overrides())
        if not cfg.greedy and cfg.seed < 0:
            cfg = replace(cfg, seed=secrets.randbits(31))
        if tools is not None and tools.forced:
            cfg = replace(cfg, grammar=tools.grammar())
        if n_prompt >= self.n_ctx:
            raise ContextLengthError(f"the prompt has {n_prompt} tokens and the context holds {self.n_ctx}: shorten it")
        if cfg.n_predict > self.n_ctx - n_prompt:
            cfg = replace(cfg, n_predict=self.n_ctx - n_prompt)
        return cfg

    def _tool_plan(self, req: Request) -> Optional[ToolPlan]:
        if not isinstance(req, ChatRequest):
            return None
        tools, choice = req.tools_asked()
        if tools and self.tool_format is None:
            raise ConfigError(f"{self.rt.model_path.name} has no chat template to give `tools` to")
        return plan(tools, choice, req.parallel_tool_calls, self.tool_format) if tools and self.tool_format else None

    def _prob(self, ev: TokenEvent) -> TokenProb:
        def said(token: int) -> tuple[str, bytes]:
            raw = self.rt.piece(token)
            return raw.decode("utf-8", "replace"), raw

        alts = tuple((*said(t), lp) for t, lp in ev.top)
        return TokenProb(*said(ev.token), float(ev.logprob or 0.0), alts, ev.token, tuple(t for t, _ in ev.top))

    def _check_size(self, n_chars: int) -> None:
        """Refuse a prompt text too long for the context before tokenizing it (each token covers at
        most the vocabulary's longest entry)."""
        at_least = n_chars // self.rt.longest_token
        if at_least >= self.n_ctx:
            raise ContextLengthError(
                f"the prompt has {n_chars} characters, at least {at_least} tokens, and the context "
                f"holds {self.n_ctx}: shorten it"
            )

    def _prompt(self, req: Request, tools: Optional[ToolPlan], session: Session) -> Prompt:
        if isinstance(req, ChatRequest):
            msgs, extra = req.chat_messages(), dict(req.chat_template_kwargs or {})
            if tools is not None and tools.fmt is FORMATS["generic"] and not self.knows_tools:
                msgs = generic_messages(msgs, tools.tools)
            elif tools is not None:
                extra["tools"] = tools.tools
            return session.chat(msgs, extra or None)
        text = req.prompt_text()
        return session.ids(req.prompt_ids()) if text is None else session.text(text)


PROBE_TOOL = {"type": "function", "function": {"name": "mtp_cli_probe_tool", "parameters": {"type": "object"}}}


def _tool_format(rt: Runtime) -> tuple[Optional[ToolFormat], bool]:
    """The model's tool-call format, and whether its chat template renders tools at all (one that
    does not gets them described in a system message: the generic format)."""
    try:
        template = template_of(rt.chat_file)
        text = render(rt.chat_file, [{"role": "user", "content": "x"}], *rt.special_texts(), {"tools": [PROBE_TOOL]})
    except ChatTemplateError:
        return None, False
    knows = "mtp_cli_probe_tool" in text
    return format_of(template, knows), knows


def _log(r: Record, spec_type: str) -> None:
    log.info(
        "%s: %d prompt tokens (%d cached), %d generated at %.1f t/s, %s%s, %s",
        r.id,
        r.n_prompt,
        r.n_cached,
        r.n_tokens,
        r.tokens_per_second,
        spec_type,
        f" N={r.n_max} ({r.mode}) acceptance {r.acceptance:.1%}" if drafters.drafting(spec_type) else "",
        r.stop_reason,
    )


def model_info(engine: Engine) -> dict[str, Any]:
    """The /v1/models entry of the served model."""
    info = {"id": engine.alias, "object": "model", "created": engine.created, "owned_by": "mtp-cli"}
    return {**info, "aliases": engine.aliases, "tags": engine.tags}


def now() -> int:
    return int(time.time())


__all__ = ["Engine", "Job", "Record", "ContextLengthError", "model_info"]
