"""Flash attention or not, for a context of several sequences (serve's slots) on this CPU: measured.

llama.cpp's `-fa auto` turns flash attention on wherever the device has the op. On a CPU mtp-cli
turns it off for one sequence (contexts.flash_attn_for): there both CPUs measured pay for it (a
2-vCPU Xeon with AMX 1.7x per decode at 256 positions; an AMD EPYC even to ~1000 positions, then
8-12% dearer, verify batches 16-57%). With several sequences each decode spreads its rows over them,
and on the EPYC flash attention is 5-23% cheaper there up to ~1000 positions per sequence (serve -np 4
gained 10-31% aggregate); nobody measured the Xeon. So for several sequences this CPU decides: a
model with the target's attention shape and a 64-wide residual (gguf_tools.probe_model) is decoded
one row per sequence at a few depths, both ways, rounds interleaved; flash attention goes on when
that is at least ON_MARGIN cheaper. The verdict is kept in the user cache per llama.cpp build, CPU,
shape, sequences and threads (`mtp-cli doctor` forgets it). A shape the probe cannot stand for, or
a probe that cannot run (its KV cells past KV_BUDGET even for one layer, a load that fails), says off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional

from gguf_tools.errors import BadFileError
from gguf_tools.gguf_file import GGUFFile
from gguf_tools.probe_model import N_VOCAB, write_attention_probe
from mtp_cli import llama_ext as lx
from mtp_cli.cpu_check import check_key
from mtp_cli.errors import MtpError
from mtp_cli.user_cache import cache_dir

log = logging.getLogger(__name__)

ON_MARGIN = 0.97  # flash attention on only when the probe's decodes cost at most this much of off's
DEPTHS = (64, 256, 1024)  # positions per sequence the decodes are timed at (chat turns to long ones)
MAX_LAYERS = 8  # the sign of the difference is per layer; more layers only lengthen the probe
KV_BUDGET = 512 << 20  # bytes of KV cells the probe's two contexts may hold (fewer layers past it; none: off)
CELL_BYTES = {"f32": 4, "f16": 2, "bf16": 2}  # (the unquantized cells flash_attn_for lets it measure)
MAX_HEADS, MAX_HEAD_DIM = 1024, 1024  # past these a shape is not probed (llama.cpp's own go to 576 / 512)
ROUNDS, BLOCK = 4, 4  # rounds of both settings, interleaved; decodes per block (the first not timed)


@dataclass(frozen=True)
class AttentionShape:
    """What a decode's attention costs depends on (the KV cells unquantized: flash_attn_for)."""

    n_layer: int
    n_head: int
    n_head_kv: int
    d_k: int
    d_v: int
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"

    @classmethod
    def of(cls, gf: GGUFFile) -> Optional[AttentionShape]:
        """The file's attention, or None where a llama block does not stand for it (MLA, sliding
        windows, head counts that differ by layer, key and value heads of different sizes, sizes
        past MAX_HEADS / MAX_HEAD_DIM) or the header says something odd."""
        if any(gf.arch_get(k) is not None for k in ("attention.kv_lora_rank", "attention.sliding_window")):
            return None
        n_layer, n_embd = gf.arch_get("block_count"), gf.arch_get("embedding_length")
        raw_kv = gf.arch_get("attention.head_count_kv")
        n_head, n_head_kv = _one(gf.arch_get("attention.head_count")), _one(raw_kv)
        if not (_int(n_layer) and _int(n_embd) and n_head) or (raw_kv is not None and not n_head_kv):
            return None
        n_head_kv = n_head_kv or n_head
        d_k = gf.arch_get("attention.key_length", n_embd // n_head)
        d_v = gf.arch_get("attention.value_length", d_k)
        fits = n_head_kv <= n_head <= MAX_HEADS and n_head % n_head_kv == 0
        # (a llama block needs equal head sizes, and rope an even one)
        if not (fits and _int(d_k) and d_k == d_v and d_k % 2 == 0 and d_k <= MAX_HEAD_DIM):
            return None
        return cls(min(n_layer, MAX_LAYERS), n_head, n_head_kv, d_k, d_v)


def _int(v: Any) -> bool:
    """A positive int (a header's counts and sizes; not a bool)."""
    return type(v) is int and v > 0


def _one(v: Any) -> Optional[int]:
    """A per-layer value that is the same for every layer (0s: layers without attention), else None."""
    if v is None or _int(v):
        return v
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        return None
    seen = set(v) - {0}
    one = seen.pop() if len(seen) == 1 else None
    return one if _int(one) else None


@dataclass(frozen=True)
class Verdict:
    on: bool
    on_ms: float  # a decode of one row per sequence, summed over the depths
    off_ms: float
    fresh: bool = False  # measured now (else read from the cache)

    @property
    def ms(self) -> tuple[float, float]:
        return self.on_ms, self.off_ms


def _key(shape: AttentionShape, n_seq: int, n_threads: int) -> str:
    # (the probe's own settings too: a verdict of another probe is measured again)
    text = json.dumps([check_key(), asdict(shape), n_seq, n_threads, DEPTHS, ON_MARGIN, ROUNDS, BLOCK, KV_BUDGET])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_file(key: str) -> Path:
    return cache_dir() / "attention" / f"{key}.json"


_verdicts: dict[tuple[AttentionShape, int, int], Verdict] = {}  # this process's


def choose(shape: AttentionShape, n_seq: int, n_threads: Optional[int]) -> Verdict:
    """Flash attention for a context of `n_seq` sequences of this shape: from this process, the
    cache, or the probe (then cached). A probe that cannot run says off (and is not cached)."""
    threads = n_threads or lx.default_threads()
    if (shape, n_seq, threads) in _verdicts:
        return _verdicts[shape, n_seq, threads]
    key = _key(shape, n_seq, threads)
    v = _saved(key)
    if v is None:
        log.info("flash attention for %d sequences: measuring which is faster on this CPU (once)", n_seq)
        try:
            on_ms, off_ms = measure(shape, n_seq, threads)
        except (MtpError, BadFileError, OSError, MemoryError) as e:
            log.warning("flash attention for %d sequences: off (the probe could not run: %s)", n_seq, e)
            on_ms = off_ms = 0.0
        v = Verdict(0.0 < on_ms <= ON_MARGIN * off_ms, on_ms, off_ms, fresh=True)
        if off_ms > 0.0:
            _save(key, v)
    how = "measured now" if v.fresh else "measured before"
    word = "on" if v.on else "off"
    log.info("flash attention for %d sequences: %s (%.2f ms against %.2f, %s)", n_seq, word, *v.ms, how)
    _verdicts[shape, n_seq, threads] = v
    return v


def _saved(key: str) -> Optional[Verdict]:
    """The cached verdict, or None (none, or not one: measured again)."""
    try:
        saved = json.loads(_cache_file(key).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(saved, dict) or type(saved.get("on")) is not bool:
        return None
    ms: list[Any] = [saved.get(k) for k in ("on_ms", "off_ms")]
    if not all(type(x) in (int, float) and 0.0 < x < 1e9 for x in ms):
        return None
    return Verdict(saved["on"], float(ms[0]), float(ms[1]))


def _save(key: str, v: Verdict) -> None:
    path = _cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a temporary of its own: two commands measuring at once each write theirs, the last one wins
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            f.write(json.dumps({"on": v.on, "on_ms": v.on_ms, "off_ms": v.off_ms}))
        Path(f.name).replace(path)
    except OSError as e:  # (a read-only cache: the probe runs again next time, nothing else is lost)
        log.warning("could not save the attention probe's verdict in %s: %s", path, e)


def forget() -> None:
    """Drop every verdict, this process's and the cache's (`mtp-cli doctor`, tests)."""
    _verdicts.clear()
    folder = cache_dir() / "attention"
    for p in [*folder.glob("*.json"), *folder.glob("*.tmp")]:
        try:
            p.unlink(missing_ok=True)
        except OSError as e:  # (a read-only cache: its verdicts stay)
            log.warning("could not forget %s: %s", p, e)


def measure(shape: AttentionShape, n_seq: int, n_threads: int) -> tuple[float, float]:
    """(with, without) flash attention: ms of a decode of one row per sequence, medians summed
    over DEPTHS. Fewer layers where the KV cells would pass KV_BUDGET; (0, 0) where even one would."""
    per_seq = max(DEPTHS) + BLOCK + 8
    cells = per_seq * n_seq * shape.n_head_kv  # (a layer's, in each context; llama.cpp pads a little more)
    per_layer = 2 * cells * (shape.d_k * CELL_BYTES[shape.cache_type_k] + shape.d_v * CELL_BYTES[shape.cache_type_v])
    n_layer = min(shape.n_layer, KV_BUDGET // per_layer)
    if n_layer < 1:
        log.info("flash attention for %d sequences: not probed (KV cells of %d MiB a layer)", n_seq, per_layer >> 20)
        return 0.0, 0.0
    shape = replace(shape, n_layer=n_layer)
    with tempfile.TemporaryDirectory(prefix="mtp-cli-attention-") as tmp:
        path = write_attention_probe(Path(tmp) / "probe.gguf", **_shape_args(shape), n_ctx=per_seq)
        with lx.load_model(path) as model:
            ctxs = {on: _context(model, shape, n_seq, n_threads, per_seq, on) for on in (True, False)}
            times: dict[tuple[bool, int], list[float]] = {}
            filled = 0
            for depth in DEPTHS:
                for ctx in ctxs.values():
                    _fill(ctx, n_seq, filled, depth)
                filled = depth
                for r in range(ROUNDS):
                    for on in (True, False) if r % 2 == 0 else (False, True):
                        times.setdefault((on, depth), []).extend(timed(ctxs[on], n_seq, depth))
    on_ms, off_ms = (sum(statistics.median(times[on, d]) * 1000 for d in DEPTHS) for on in (True, False))
    return on_ms, off_ms


def _shape_args(shape: AttentionShape) -> dict[str, int]:
    names = ("n_layer", "n_head", "n_head_kv", "d_k", "d_v")
    return {k: getattr(shape, k) for k in names}


def _context(model: lx.Model, shape: AttentionShape, n_seq: int, n_threads: int, per_seq: int, on: bool) -> lx.Context:
    kv = lx.KvOptions(shape.cache_type_k, shape.cache_type_v, flash_attn=on)
    n_batch = max(512, n_seq)
    return lx.create_context(model, n_ctx=per_seq * n_seq, n_batch=n_batch, n_threads=n_threads, n_seq_max=n_seq, kv=kv)


def _fill(ctx: lx.Context, n_seq: int, p0: int, p1: int) -> None:
    """Positions [p0, p1) of every sequence (any tokens: only what attention costs matters): decoded
    into sequence 0, copied to the others."""
    batch = lx.Batch(512)
    for a in range(p0, p1, 512):
        batch.clear()
        batch.add_many([3 + (p % (N_VOCAB - 3)) for p in range(a, min(p1, a + 512))], a, seq_id=0, logits_last=True)
        lx.decode(ctx, batch)
    for s in range(1, n_seq):
        lx.memory_seq_copy(ctx, 0, s)


def timed(ctx: lx.Context, n_seq: int, depth: int, rows: int = 1, block: int = BLOCK) -> list[float]:
    """Seconds of `block` - 1 decodes (the first, a new graph shape, not timed) of `rows` rows of
    every sequence at `depth`, each rolled back (benchmarks/attention_bench.py times these too)."""
    batch, out = lx.Batch(max(512, n_seq * rows)), []
    for i in range(block):
        batch.clear()
        for s in range(n_seq):
            for j in range(rows):
                batch.add(3 + (s + j) % (N_VOCAB - 3), depth + j, seq_id=s, logits=True)
        t = time.perf_counter()
        lx.decode(ctx, batch)
        if i:
            out.append(time.perf_counter() - t)
        for s in range(n_seq):
            lx.memory_seq_rm(ctx, s, depth, -1)
    return out


__all__ = ["AttentionShape", "Verdict", "choose", "forget", "measure", "timed"]
