"""`serve --metrics`: Prometheus text at /metrics, under llama-server's metric names (so dashboards
built for it work), plus what drafting did: drafted and accepted tokens by draft position, verify
passes, and the drafting mode. Counted as requests end (and embeddings as they are computed)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from mtp_cli.stats import GenStats


@dataclass
class Totals:
    prompt_tokens: int = 0  # decoded (the cached share apart)
    prompt_cached: int = 0
    prompt_seconds: float = 0.0
    predicted: int = 0
    predicted_seconds: float = 0.0
    decodes: int = 0  # target decodes: one per prompt, one per verify pass
    busy_rows: int = 0  # sum over decodes of the requests they served (a batched decode serves several)
    n_tokens_max: int = 0
    drafted: int = 0
    accepted: int = 0
    drafting_passes: int = 0  # verify passes that carried drafts
    requests: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)


# (name, type, help, value of Totals / the live gauges)
COUNTERS = (
    ("prompt_tokens_total", "counter", "Prompt tokens decoded (cached ones apart)."),
    ("prompt_tokens_cached_total", "counter", "Prompt tokens found in the cache."),
    ("prompt_seconds_total", "counter", "Prompt processing time."),
    ("tokens_predicted_total", "counter", "Tokens generated."),
    ("tokens_predicted_seconds_total", "counter", "Generation time (after the first token)."),
    ("n_decode_total", "counter", "Target decodes (prompts and verify passes)."),
    ("n_tokens_max", "counter", "Largest prompt + generation seen, in tokens."),
    ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified."),
    ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted."),
    ("spec_decode_num_drafts_total", "counter", "Verify passes that carried drafts."),
)


class Metrics:
    """Totals kept by the worker thread, read by the HTTP one."""

    def __init__(self) -> None:
        self.t = Totals()
        self.started = int(time.time())
        self._lock = threading.Lock()

    def add(self, st: GenStats, batched: bool = False) -> None:
        """A request that ended; its decodes counted here unless a batch runner counts them (`step`)."""
        with self._lock:
            t = self.t
            t.requests += 1
            t.prompt_tokens += st.n_prompt - st.n_cached
            t.prompt_cached += st.n_cached
            t.prompt_seconds += st.t_prompt
            t.predicted += st.n_tokens
            t.predicted_seconds += st.t_gen if st.n_tokens > st.n_first else 0.0
            if not batched:  # (one request at a time: its own decodes, one request each)
                t.decodes += st.n_verify + (st.n_prompt > st.n_cached)
                t.busy_rows += st.n_verify + (st.n_prompt > st.n_cached)
            t.n_tokens_max = max(t.n_tokens_max, st.n_prompt + st.n_tokens)
            t.drafted += st.n_drafted
            t.accepted += st.n_accepted
            t.drafting_passes += st.drafted_at[0] if st.drafted_at else 0
            t.drafted_at = _add(t.drafted_at, st.drafted_at)
            t.accepted_at = _add(t.accepted_at, st.accepted_at)

    def step(self, n_requests: int) -> None:
        """One batched decode serving `n_requests` requests (serve -np)."""
        with self._lock:
            self.t.decodes += 1
            self.t.busy_rows += n_requests

    def add_prompt(self, n_tokens: int, seconds: float) -> None:
        """An embedding's inputs: prompt tokens decoded."""
        with self._lock:
            self.t.prompt_tokens += n_tokens
            self.t.prompt_seconds += seconds
            self.t.decodes += 1
            self.t.busy_rows += 1

    def text(self, processing: int, deferred: int, mode: str, spec_type: str) -> str:
        """The Prometheus exposition (text format 0.0.4)."""
        with self._lock:
            t = Totals(
                **{**self.t.__dict__, "drafted_at": list(self.t.drafted_at), "accepted_at": list(self.t.accepted_at)}
            )
        values = (
            t.prompt_tokens,
            t.prompt_cached,
            t.prompt_seconds,
            t.predicted,
            t.predicted_seconds,
            t.decodes,
            t.n_tokens_max,
            t.drafted,
            t.accepted,
            t.drafting_passes,
        )
        out: list[str] = []
        for (name, kind, help_), v in zip(COUNTERS, values):
            out += _metric(f"llamacpp:{name}", kind, help_, v)
        gauges = (
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s.",
                _rate(t.prompt_tokens, t.prompt_seconds),
            ),
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s.",
                _rate(t.predicted, t.predicted_seconds),
            ),
            ("requests_processing", "Requests running.", processing),
            ("requests_deferred", "Requests waiting for a slot.", deferred),
            (
                "n_busy_slots_per_decode",
                "Average requests served per decode.",
                t.busy_rows / t.decodes if t.decodes else 0.0,
            ),
        )
        for name, help_, v in gauges:
            out += _metric(f"llamacpp:{name}", "gauge", help_, v)
        out += [
            "# HELP mtpcli:draft_tokens_by_pos_total Draft tokens verified, by draft position.",
            "# TYPE mtpcli:draft_tokens_by_pos_total counter",
        ]
        out += [f'mtpcli:draft_tokens_by_pos_total{{pos="{i + 1}"}} {n}' for i, n in enumerate(t.drafted_at)]
        out += [
            "# HELP mtpcli:accepted_tokens_by_pos_total Draft tokens accepted, by draft position.",
            "# TYPE mtpcli:accepted_tokens_by_pos_total counter",
        ]
        out += [f'mtpcli:accepted_tokens_by_pos_total{{pos="{i + 1}"}} {n}' for i, n in enumerate(t.accepted_at)]
        out += _metric("mtpcli:requests_total", "counter", "Requests that ended.", t.requests)
        out += [
            "# HELP mtpcli:drafting How the server drafts: its spec type and draft-length mode (value 1).",
            "# TYPE mtpcli:drafting gauge",
            f'mtpcli:drafting{{spec_type="{spec_type}",mode="{mode}"}} 1',
        ]
        return "\n".join(out) + "\n"


def _metric(name: str, kind: str, help_: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {_num(value)}"]


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def _add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


__all__ = ["Metrics", "Totals"]
