"""What a job reports (Started, then Deltas, then Done; or Failed), how its text is streamed out of
a Generation (stop strings and possible tool calls held back), and the figures a response carries
(the `mtp` object, llama-server's `timings`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Protocol, Union

from mtp_cli.config import GenConfig
from mtp_cli.policy import NoDrafts
from mtp_cli.serve.tools import Call
from mtp_cli.speed.auto import Resolved
from mtp_cli.stats import Generation, GenStats, TokenEvent

FINISH = {"eog": "stop", "n_predict": "length", "ctx_full": "length"}  # GenStats.stop_reason -> OpenAI's


@dataclass(frozen=True)
class Started:
    n_prompt: int
    n_cached: int
    thinking: bool = False  # (the prompt ends in an open thinking block: the answer begins inside it)
    prompt_text: Optional[str] = None  # (the prompt as decoded, special tokens spelled: `verbose` asked)


@dataclass(frozen=True)
class TokenProb:
    """One generated token's log-probability and its most likely alternatives', as text and bytes."""

    text: str
    raw: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...]
    id: int = -1
    top_ids: tuple[int, ...] = ()


Piece = tuple[int, str, bool]  # a generated token: its id, its text, whether it came from an accepted draft


@dataclass(frozen=True)
class Delta:
    text: str
    probs: tuple[TokenProb, ...] = ()  # (the tokens since the last delta, when log-probabilities are asked)
    pieces: tuple[Piece, ...] = ()  # (the tokens since the last delta)
    timings: Optional[dict[str, Any]] = None  # (llama-server's timings so far, when asked per token)


@dataclass(frozen=True)
class Done:
    text: str
    finish_reason: str  # stop | length
    stats: GenStats
    mtp: dict[str, Any]
    timings: dict[str, Any]
    probs: Optional[tuple[TokenProb, ...]] = None  # (every token's, when log-probabilities are asked)
    tool_calls: tuple[Call, ...] = ()
    stop_sequence: Optional[str] = None  # (the stop string that ended it)
    tokens: tuple[int, ...] = ()  # (every generated token's id)


@dataclass(frozen=True)
class Progress:
    """The prompt's processing so far (llama-server's prompt_progress: return_progress)."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def doc(self) -> dict[str, Any]:
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}

    def timings(self) -> dict[str, Any]:
        """llama-server's timings while the prompt is processed (nothing predicted yet)."""
        n = self.processed - self.cache
        return {
            "cache_n": self.cache,
            "prompt_n": n,
            "prompt_ms": self.time_ms,
            "prompt_per_token_ms": self.time_ms / n if n else 0.0,
            "prompt_per_second": n / self.time_ms * 1e3 if n and self.time_ms > 0 else 0.0,
            "predicted_n": 0,
            "predicted_ms": 0.0,
            "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0,
        }


def reporter(job: Emitting) -> Callable[[int, int], None]:
    """A generation's `progress` callback that emits Progress events to `job` (the first call
    says what the cache held; time counts from it)."""
    start: list[float] = []

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if not start:
            start.extend((now, float(done)))
        job.emit(Progress(total, int(start[1]), done, (now - start[0]) * 1e3))  # (the first: 0 ms)

    return report


@dataclass(frozen=True)
class Failed:
    error: BaseException
    status: int  # 400 for a request mtp-cli refuses, 500 for its own failure


Event = Union[Started, Delta, Done, Failed, Progress]


class Streamed(NamedTuple):
    """What a TextStream sent, once closed."""

    text: str
    cut: Optional[str]  # the stop string that cut it, or None
    probs: tuple[TokenProb, ...]  # every token's log-probabilities, when asked
    sent: int  # how much of the text was sent
    tokens: tuple[int, ...]  # every token's id


class Emitting(Protocol):
    """A job, as the stream sees it."""

    @property
    def cancelled(self) -> Any: ...

    def emit(self, ev: Event) -> None: ...


class TextStream:
    """A job's text as its tokens come: emitted as Deltas, holding back what could begin a stop string
    and, from where `held` says tool calls may begin, what could be one."""

    def __init__(
        self,
        job: Emitting,
        stops: list[str],
        prob: Callable[[TokenEvent], TokenProb],
        held: Optional[Callable[[str], int]] = None,
        live: Optional[GenStats] = None,
    ):
        self.job, self.stops, self.prob, self.held = job, stops, prob, held
        self.live = live  # (the generation's stats, read into each delta's timings: timings_per_token)
        self.out, self.sent = "", 0
        self.cut: Optional[str] = None  # (the stop string that cut the text)
        self.probs: list[TokenProb] = []
        self.pieces: list[Piece] = []
        self._told = self._told_pieces = 0  # (probs and pieces already sent with a delta)
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._hold_calls = 16 if held else 0  # (an opener not yet whole, e.g. "<tool_ca")

    def _visible(self) -> int:
        end = len(self.out) - max(self._hold, self._hold_calls)
        at = self.held(self.out) if self.held else -1
        return min(end, at) if at >= 0 else end

    def feed(self, ev: TokenEvent) -> bool:
        """One token; True when a stop string cut the text here (the generation is to stop)."""
        if ev.logprob is not None:
            self.probs.append(self.prob(ev))
        self.pieces.append((ev.token, ev.text, ev.source == "draft"))
        lo = max(0, len(self.out) - self._hold)
        self.out += ev.text
        if self.stops:
            found = [(i, s) for s in self.stops if (i := self.out.find(s, lo)) >= 0]
            if found:
                at, self.cut = min(found)
                self.out = self.out[:at]
                return True
        upto = self._visible()
        if upto > self.sent:
            self._send(upto)
        return False

    def _send(self, upto: int) -> None:
        probs, pieces = tuple(self.probs[self._told :]), tuple(self.pieces[self._told_pieces :])
        now = timings(self.live) if self.live is not None else None
        self.job.emit(Delta(self.out[self.sent : upto], probs, pieces, now))
        self.sent, self._told, self._told_pieces = upto, len(self.probs), len(self.pieces)

    def close(self) -> Streamed:
        """The rest sent (nothing held back now), and what was sent."""
        self._hold = self._hold_calls = 0
        upto = max(self.sent, self._visible())
        if (upto > self.sent or len(self.probs) > self._told) and not self.job.cancelled.is_set():
            self._send(upto)
        return Streamed(self.out, self.cut, tuple(self.probs), self.sent, tuple(p[0] for p in self.pieces))


def stream(
    gen: Generation,
    job: Emitting,
    stops: list[str],
    prob: Callable[[TokenEvent], TokenProb],
    held: Optional[Callable[[str], int]] = None,
    live: bool = False,
) -> Streamed:
    """Run the generation through a TextStream (see there) until it ends, is cut, or is cancelled."""
    ts = TextStream(job, stops, prob, held, gen.stats if live else None)
    try:
        for ev in gen:
            if job.cancelled.is_set() or ts.feed(ev):
                break
    finally:
        gen.close()
    return ts.close()


def draft_n_max(st: GenStats, res: Resolved) -> int:
    """The draft length a request ran at, as reported: 0 where it turned drafting off (NoDrafts keeps
    the server's N only so that the contexts stay as they are)."""
    return 0 if isinstance(res.policy, NoDrafts) else st.n_max


def figures(st: GenStats, res: Resolved, cfg: GenConfig) -> dict[str, Any]:
    """The response's `mtp` object: what drafting did for this request."""
    doc: dict[str, Any] = {
        "spec_type": st.spec_type,
        "mode": res.mode,
        "draft_n_max": draft_n_max(st, res),
        "verify_passes": st.n_verify,
        "drafted": st.n_drafted,
        "accepted": st.n_accepted,
        "acceptance": round(st.acceptance, 4),
        "acceptance_by_pos": [round(x, 4) for x in st.acceptance_by_pos],
        "drafted_by_pos": list(st.drafted_at),  # (counts: what pools over requests)
        "accepted_by_pos": list(st.accepted_at),
        "tokens_per_pass": round(st.tokens_per_pass, 4),
        "tokens_per_second": round(st.tokens_per_second, 2),
        "prompt_tokens_per_second": round(st.prompt_tokens_per_second, 2),
        "seed": None if cfg.greedy else cfg.seed,
    }
    if res.controller is not None:
        doc["adaptive"] = res.controller.summary()
    return doc


def timings(st: GenStats) -> dict[str, Any]:
    """llama-server's `timings` object (front-ends written for it read acceptance from here), unrounded
    as llama-server gives it: the rates follow from the counts and times shown. The first token is
    the prompt pass's, so the generation rate is over the tokens after it."""
    n_prompt, n_gen = st.n_prompt - st.n_cached, st.n_tokens
    prompt_ms, gen_ms = st.t_prompt * 1e3, st.t_gen * 1e3
    stepped = n_gen - st.n_first
    return {
        "cache_n": st.n_cached,
        "prompt_n": n_prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
        "prompt_per_second": st.prompt_tokens_per_second,
        "predicted_n": n_gen,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / stepped if stepped > 0 and gen_ms > 0 else 0.0,
        "predicted_per_second": stepped / gen_ms * 1e3 if stepped > 0 and gen_ms > 0 else 0.0,
        "draft_n": st.n_drafted,
        "draft_n_accepted": st.n_accepted,
    }


__all__ = [
    "Started",
    "TokenProb",
    "Delta",
    "Done",
    "Failed",
    "Progress",
    "reporter",
    "Event",
    "FINISH",
    "TextStream",
    "Streamed",
    "Piece",
    "stream",
    "figures",
    "draft_n_max",
    "timings",
]
