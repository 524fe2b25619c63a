"""Measuring decoding speed and its cost model (shared by `tune`, `bench` and benchmarks/spec_bench.py).

- `run_setting`: one pass of a setting over the prompts; GenStats pooled across them (tokens /
  generation seconds, so long and short prompts weigh by their tokens).
- `median_run`: repeats of that, the median by tokens/s.
- `measure_costs`: the machine's cost model (DESIGN 6), measured directly with llama_decode:
  T = one plain token; v(N) = a target decode of N+1 tokens with logits on every row (and the
  MTP h rows on), relative to T; c(m) = a step's first head decode, of m rows (it also carries the
  a tokens accepted by the previous step: m = a + 1, and several rows cost more than one on a
  CPU); c = a later one-row head decode of the step. Both are timed interleaved with the verify
  decodes, as a step runs them (the two models evict each other from the CPU caches: timed back
  to back, a step's head decodes came out 0.5-1.0 ms cheaper than in the loop). With the per-step
  Python overheads from real runs, one MTP step at N costs
      cost(N) = v(N) + c(E) + (N-1) c + o(N)      (c(E): the first decode, at the mean m = E),
  and MTP's speed ratio is E(N) (1 + o_plain) / cost(N), E(N) = 1 + sum_{i<N} A_i,
  A_i = P(the first i+1 drafts are accepted) (GenStats.acceptance_by_pos); with i.i.d. per-token
  acceptance alpha, E(N) = sum_{i=0..N} alpha^i, and `break_even_alpha` solves for the alpha at
  which MTP only ties with plain decoding.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from mtp_cli import llama_ext as lx
from mtp_cli.runtime import GenConfig, GenStats, NoMtpHeadError, Runtime

_now = time.perf_counter

PROMPTS = [
    "Write a short email to a colleague asking to move our meeting to Thursday.",
    "Give me a simple recipe for pancakes.",
    "Tell a short story about a lighthouse keeper.",
    "How do I change a flat tire on a bicycle?",
    "Explain why the sky is blue.",
    "List five tips for better sleep.",
]


def read_prompts(path) -> list[str]:
    """One prompt per line; blank lines and lines starting with # are skipped."""
    from pathlib import Path

    from mtp_cli.runtime import ConfigValueError

    p = Path(path)
    try:
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigValueError(f"{p}: cannot read the prompts: {getattr(e, 'strerror', None) or e}") from None
    prompts = [ln for ln in lines if ln and not ln.startswith("#")]
    if not prompts:
        raise ConfigValueError(f"{p}: no prompts (one per line)")
    return prompts


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------


def pool(stats: Sequence[GenStats], spec_type: str = "none") -> GenStats:
    """GenStats summed over generations (tokens/s = total tokens / total generation seconds)."""
    total = GenStats(spec_type=spec_type)
    for s in stats:
        total.n_max = max(total.n_max, s.n_max)
        total.n_prompt += s.n_prompt
        total.n_tokens += s.n_tokens
        total.t_prompt += s.t_prompt
        total.t_gen += s.t_gen
        total.t_consumer += s.t_consumer
        total.n_verify += s.n_verify
        total.n_drafted += s.n_drafted
        total.n_accepted += s.n_accepted
        total.t_target_decode += s.t_target_decode
        total.t_draft_decode += s.t_draft_decode
        total.n_draft_decode += s.n_draft_decode
        n = max(len(total.drafted_at), len(s.drafted_at))
        total.drafted_at += [0] * (n - len(total.drafted_at))
        total.accepted_at += [0] * (n - len(total.accepted_at))
        for i in range(len(s.drafted_at)):
            total.drafted_at[i] += s.drafted_at[i]
            total.accepted_at[i] += s.accepted_at[i]
    return total


@dataclass
class RunResult:
    """One setting's measurement: the pooled stats of the median repeat, and every repeat's tokens/s."""

    stats: GenStats
    runs: list[float] = field(default_factory=list)  # tokens/s of each repeat
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the adaptive controller's summary

    @property
    def tokens_per_second(self) -> float:
        return self.stats.tokens_per_second

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats: the run-to-run noise."""
        if len(self.runs) < 2:
            return 0.0
        m = statistics.median(self.runs)
        return (max(self.runs) - min(self.runs)) / m if m > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        s = self.stats
        steps = max(s.n_verify, 1)
        return {
            "tokens_per_second": s.tokens_per_second, "tokens_per_second_runs": list(self.runs),
            "tokens": s.n_tokens, "verify_passes": s.n_verify, "acceptance": s.acceptance,
            "acceptance_by_pos": s.acceptance_by_pos, "mean_accepted_per_pass": s.mean_accepted_per_pass,
            "tokens_per_pass": s.tokens_per_pass,
            "target_decode_ms_per_step": 1e3 * s.t_target_decode / steps,
            "draft_decode_ms_per_step": 1e3 * s.t_draft_decode / steps,
            "python_overhead_ms_per_step": 1e3 * s.t_overhead / steps,
            **self.extra,
        }


def run_setting(rt: Runtime, prompts: Sequence[Sequence[int]], cfg: GenConfig, *, controller: Any = None) -> GenStats:
    """One pass over all prompts (one controller, if given, for the whole pass); pooled stats."""
    out = []
    spec = cfg.spec_type
    for toks in prompts:
        for _ in rt.generate(toks, cfg, controller=controller):
            pass
        out.append(rt.stats)
        spec = rt.stats.spec_type
    return pool(out, spec)


def median_run(rt: Runtime, prompts: Sequence[Sequence[int]], cfg: GenConfig, repeats: int, *,
               controller_factory: Optional[Callable[[], Any]] = None) -> RunResult:
    """`repeats` passes (a fresh controller per pass when controller_factory is given); the median pass."""
    runs = []
    ctl = None
    for _ in range(max(1, repeats)):
        ctl = controller_factory() if controller_factory else None
        runs.append(run_setting(rt, prompts, cfg, controller=ctl))
    order = sorted(runs, key=lambda s: s.tokens_per_second)
    res = RunResult(order[len(order) // 2], [s.tokens_per_second for s in runs])
    if ctl is not None and hasattr(ctl, "summary"):
        res.extra["adaptive"] = ctl.summary()
    return res


@dataclass
class Setting:
    """A named configuration to measure; settings with a controller_factory get a fresh controller
    (e.g. an AdaptiveController) for every repeat, so each repeat pays its own learning."""

    name: str
    config: GenConfig
    controller_factory: Optional[Callable[[], Any]] = None


def interleaved(rt: Runtime, prompts: Sequence[Sequence[int]], settings: Sequence[Setting], repeats: int, *,
                on_run: Optional[Callable[[str, int, GenStats], None]] = None,
                deadline: Optional[float] = None) -> dict[str, RunResult]:
    """Every setting `repeats` times, repeat by repeat (the order rotated each repeat), so slow drift
    in the machine's speed hits every setting alike; the median repeat of each. With a deadline
    (time.perf_counter() value) the remaining repeats are skipped once it has passed (at least one
    repeat always runs)."""
    passes: dict[str, list[GenStats]] = {s.name: [] for s in settings}
    summaries: dict[str, Any] = {}
    order = list(settings)
    for r in range(max(1, repeats)):
        if r and deadline is not None and _now() > deadline:
            break
        k = r % len(order) if order else 0
        for s in order[k:] + order[:k]:
            ctl = s.controller_factory() if s.controller_factory else None
            st = run_setting(rt, prompts, s.config, controller=ctl)
            passes[s.name].append(st)
            if ctl is not None and hasattr(ctl, "summary"):
                summaries[s.name] = ctl.summary()
            if on_run is not None:
                on_run(s.name, r, st)
    out = {}
    for s in settings:
        runs = passes[s.name]
        ranked = sorted(runs, key=lambda x: x.tokens_per_second)
        res = RunResult(ranked[len(ranked) // 2], [x.tokens_per_second for x in runs])
        if s.name in summaries:
            res.extra["adaptive"] = summaries[s.name]
        out[s.name] = res
    return out


# ---------------------------------------------------------------------------------------------
# the cost model
# ---------------------------------------------------------------------------------------------


@dataclass
class CostModel:
    """Costs relative to T (one plain token's llama_decode); see the module docstring."""

    t_ms: float  # T
    verify: list[float]  # v(N), N = 0..n_max (v(0): one token with MTP's h rows on)
    draft: float  # c: a step's later one-row head decode
    draft_rows: list[float] = field(default_factory=list)  # c(m), m = 1.. rows in a step's first head decode
    overhead_plain: float = 0.0  # per plain token, outside llama_decode
    overhead: dict[int, float] = field(default_factory=dict)  # per MTP step at N, outside llama_decode

    @property
    def n_max(self) -> int:
        return len(self.verify) - 1

    def overhead_at(self, n: int) -> float:
        """o(N): measured, else interpolated linearly between measured N (flat beyond them); o_plain if none."""
        if n in self.overhead:
            return self.overhead[n]
        if not self.overhead:
            return self.overhead_plain
        ks = sorted(self.overhead)
        if n <= ks[0]:
            return self.overhead[ks[0]]
        if n >= ks[-1]:
            return self.overhead[ks[-1]]
        lo = max(k for k in ks if k < n)
        hi = min(k for k in ks if k > n)
        return self.overhead[lo] + (self.overhead[hi] - self.overhead[lo]) * (n - lo) / (hi - lo)

    def rows_cost(self, m: float) -> float:
        """c(m): one head decode of m rows (interpolated; c * m past the measured range)."""
        rows = self.draft_rows or [self.draft]
        if m <= 1:
            return rows[0]
        i = int(m)
        if i >= len(rows):
            return rows[-1] + (m - len(rows)) * self.draft
        return rows[i - 1] + (rows[i] - rows[i - 1]) * (m - i)

    def draft_cost(self, n: int, tokens: float = 1.0) -> float:
        """The head's decodes in one step at N when steps emit `tokens` on average: c(E) + (N-1) c."""
        return self.rows_cost(tokens) + (n - 1) * self.draft

    def step_cost(self, n: int, tokens: float = 1.0) -> float:
        """One MTP step at N, relative to T: v(N) + c(E) + (N-1) c + o(N)."""
        return self.verify[n] + self.draft_cost(n, tokens) + self.overhead_at(n)

    @property
    def plain_cost(self) -> float:
        return 1.0 + self.overhead_plain

    def break_even_tokens(self, n: int) -> float:
        """Tokens per verify step MTP needs at N to tie with plain decoding (the E with
        E (1 + o_plain) = cost(N, E); more than N+1 if it cannot pay)."""
        f = lambda e: e * self.plain_cost - self.step_cost(n, e)  # noqa: E731  (increasing in e here)
        if f(1.0) >= 0:
            return 1.0
        if f(n + 1.0) < 0:
            return self.step_cost(n, n + 1.0) / self.plain_cost
        lo, hi = 1.0, n + 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2

    def break_even_alpha(self, n: int) -> Optional[float]:
        """The i.i.d. per-token acceptance at which MTP at N ties with plain decoding (None: it cannot
        pay even at 100%)."""
        return solve_alpha(self.break_even_tokens(n), n)

    def ratio(self, n: int, acceptance_by_pos: Sequence[float]) -> float:
        """Predicted speed of MTP at N relative to plain decoding, for this acceptance curve
        (cumulative: A_i = P(first i+1 drafts accepted); positions past the curve count as 0)."""
        e = 1.0 + sum(acceptance_by_pos[:n])
        return e * self.plain_cost / self.step_cost(n, e)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overhead"] = {str(k): v for k, v in self.overhead.items()}
        d["break_even"] = [{"n": n, "tokens_per_step": self.break_even_tokens(n), "alpha": self.break_even_alpha(n)}
                           for n in range(1, self.n_max + 1)]
        return d

    def relative_costs(self, tokens: float = 1.0) -> list[float]:
        """Step cost by N (N=0: plain decoding), relative to plain decoding: an AdaptiveController prior."""
        return [1.0] + [self.step_cost(n, tokens) / self.plain_cost for n in range(1, self.n_max + 1)]


def expected_tokens(alpha: float, n: int) -> float:
    """sum_{i=0..n} alpha^i: tokens per verify step with i.i.d. acceptance alpha and n drafts."""
    return float(n + 1) if alpha >= 1.0 else (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def solve_alpha(tokens: float, n: int) -> Optional[float]:
    """The alpha in [0, 1] with expected_tokens(alpha, n) = tokens (0 if tokens <= 1; None if > n+1)."""
    if tokens <= 1.0:
        return 0.0
    if tokens > n + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, n) < tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def measure_costs(rt: Runtime, cfg: GenConfig, n_max: int, prompt: Sequence[int], *, rounds: int = 3,
                  reps: int = 4) -> CostModel:
    """Time llama_decode directly: T (one token, plain), v(N) for N = 0..n_max (N+1 tokens, logits on
    every row, h rows on: what an MTP verify step decodes) and, after each verify at N >= 1, the
    step's head decodes: the first of m rows (m cycling through 1..n_max+1: catch-up rows + the
    draft row; c(m)), then N-1 of one row (c). Each sample decodes at the next position and removes
    the N extra cells (and the head's rows) again, as a step that accepts nothing; each round
    decodes a block of `reps` samples per N (after one whose verify is not timed: llama.cpp reuses a
    graph only for the same batch shape, as in a run at fixed N), rotating the order of N so drift hits
    every N alike; medians. Chained heads (one decode per head) are approximated by head 0's."""
    if n_max < 1:
        raise ValueError(f"the cost model needs N >= 1 (got {n_max})")
    if rt.head_model is None:
        raise NoMtpHeadError(f"{rt.model_path.name}: the cost model needs the MTP head (load the runtime for mtp)")
    base = replace(cfg.validated(), spec_type="mtp", draft_n_max=n_max, draft_p_min=0.0)
    ctxs, d = rt._contexts(base)
    tgt = ctxs.target
    need = rounds * (reps + 1) * (n_max + 2) + n_max + 2
    prompt = list(prompt)[: max(1, min(len(prompt), ctxs.n_ctx - need))]
    if len(prompt) + need > ctxs.n_ctx:
        from mtp_cli.runtime import ConfigValueError

        raise ConfigValueError(f"the context ({ctxs.n_ctx} tokens) is too small to measure costs at N={n_max}")
    toks = [prompt[i % len(prompt)] for i in range(n_max + 1)]
    b = lx.Batch(max(lx.n_batch(tgt), n_max + 1))
    lx.memory_clear(tgt)
    d.begin(prompt)
    lx.set_embeddings_nextn(tgt, True, False)
    nb = lx.n_batch(tgt)
    for p0 in range(0, len(prompt), nb):
        chunk = prompt[p0:p0 + nb]
        b.clear()
        b.add_many(chunk, p0, logits_last=True)
        lx.decode(tgt, b)
        d.on_prefill(chunk, p0)  # type: ignore[arg-type]
    d._flush()  # type: ignore[attr-defined]  # the head's memory now holds the prompt
    pos = p_end = dpos = len(prompt)
    plain: list[float] = []
    verify: list[list[float]] = [[] for _ in range(n_max + 1)]
    first: list[list[float]] = [[] for _ in range(n_max + 1)]  # c(m), by m - 1
    single: list[float] = []  # c
    n_first = 0  # measured first decodes so far: m cycles with it, so the measured m are always 1..k
    db = lx.Batch(n_max + 1, d.E)  # type: ignore[attr-defined]
    shared = getattr(d, "mem_shared", False)

    def rewind() -> None:  # decode cost grows with the position: measure every block from the prompt's end
        nonlocal pos
        if not rt.recurrent:  # (a recurrent state cannot roll back that far; its cost hardly depends on pos)
            lx.memory_seq_rm(tgt, 0, p_end, -1)
            pos = p_end

    def plain_block() -> None:  # T: one token, plain (no h rows), kept, as plain decoding does
        nonlocal pos
        rewind()
        lx.set_embeddings_nextn(tgt, False, False)
        for i in range(reps + 1):
            b.clear()
            b.add(toks[0], pos, logits=True)
            t = _now()
            lx.decode(tgt, b)
            if i:  # the first decode of a block rebuilds the graph
                plain.append(_now() - t)
            pos += 1
        lx.set_embeddings_nextn(tgt, True, False)

    def head_step(n: int) -> None:
        """A step's head decodes at N = n, logits on each last row; the head's memory is not advanced
        (the rows are removed again). A drafter sharing the target's memory has no catch-up: m = 1."""
        nonlocal n_first
        m = 1 if shared else 1 + n_first % (n_max + 1)
        p = dpos
        for k in range(n):
            rows = m if k == 0 else 1
            db.clear()
            for j in range(rows):
                db.add(toks[j], pos if shared else p + j, logits=j == rows - 1, h=d.pending_h)  # type: ignore[attr-defined]
            t = _now()
            lx.decode(d.ctx, db)  # type: ignore[attr-defined]
            (first[m - 1] if k == 0 else single).append(_now() - t)
            p += rows
        if n:
            n_first += 1
        if not shared:
            lx.memory_seq_rm(d.ctx, 0, dpos, -1)  # type: ignore[attr-defined]

    try:
        for r in range(rounds):
            plain_block()
            order = list(range(n_max + 1))
            order = order[r % len(order):] + order[:r % len(order)]
            for n in order:  # blocks of one N, as a run at fixed N decodes (llama.cpp reuses the graph)
                rewind()
                for i in range(reps + 1):
                    b.clear()
                    for j in range(n + 1):
                        b.add(toks[j], pos + j, logits=True)
                    t = _now()
                    lx.decode(tgt, b)
                    if i:
                        verify[n].append(_now() - t)
                    if n and not lx.memory_seq_rm(tgt, 0, pos + 1, -1):
                        raise lx.LlamaError(f"the target context refused to roll back {n} positions while measuring")
                    head_step(n)  # every sample timed: the head's shapes change every step anyway
                    pos += 1
    finally:
        lx.memory_clear(tgt)
        d.begin([])
    T = statistics.median(plain)
    rows = [statistics.median(x) / T for x in first if x]
    c = statistics.median(single) / T if single else rows[0]
    return CostModel(t_ms=1e3 * T, verify=[statistics.median(v) / T for v in verify], draft=c, draft_rows=rows)


def add_overheads(cm: CostModel, results: dict[int, GenStats], plain: Optional[GenStats]) -> CostModel:
    """Fill the per-step overheads (time outside llama_decode) from real runs: plain decoding and MTP at N."""
    T = cm.t_ms / 1e3
    if plain is not None and plain.n_verify:
        cm.overhead_plain = plain.t_overhead / plain.n_verify / T
    for n, s in results.items():
        if s.n_verify:
            cm.overhead[n] = s.t_overhead / s.n_verify / T
    return cm


__all__ = ["PROMPTS", "read_prompts", "pool", "RunResult", "run_setting", "median_run", "Setting", "interleaved",
           "CostModel",
           "expected_tokens", "solve_alpha", "measure_costs", "add_overheads"]
