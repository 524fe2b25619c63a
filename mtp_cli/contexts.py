"""The contexts one runtime keeps: the target context for one set of context settings, the drafters on
it, and what the last generation left in its memory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from mtp_cli import llama_ext as lx
from mtp_cli.attention_probe import AttentionShape, choose
from mtp_cli.config import GenConfig, LoadConfig
from mtp_cli.drafters import Chain, ContextPlan, Drafter, Models
from mtp_cli.memory import Held
from mtp_cli.step_costs import StepCosts

log = logging.getLogger(__name__)

UNQUANTIZED = ("f32", "f16", "bf16")  # KV cell types llama.cpp's attention without flash attention reads
# archs whose graph changes without flash attention (minimax-m3: its sparse attention falls back to dense)
NEEDS_FLASH_ATTN = ("minimax-m3",)


def fa_auto_off(cfg: LoadConfig, arch: str) -> bool:
    """Whether `-fa auto` means off for a model loaded so: its layers, and so its KV cache, stay on
    this machine's CPU, and its graph does not need flash attention."""
    offloads = cfg.n_gpu_layers != 0 and cfg.placement.device != ("none",)
    return not (offloads and lx.supports_gpu_offload()) and arch not in NEEDS_FLASH_ATTN


def flash_attn_for(
    cfg: GenConfig, auto_off: bool, n_seq: int = 1, shape: Optional[AttentionShape] = None
) -> Optional[bool]:
    """The flash attention a context of `n_seq` sequences is created with: the config's when given;
    where `auto_off` (fa_auto_off) and the KV cells are not quantized, off for one sequence and
    measured on this CPU for several (attention_probe, with the model's `shape`; off without one);
    else llama.cpp's auto. Why: llama.cpp's auto turns it on wherever the device has the op, and its
    CPU kernel reads the cache one query row at a time (below 64 rows): a plain decode 1.7x slower
    at 256 positions and 2.2x at 1024, an 8-row verify batch 2.0x and 4.2x on a Xeon with AMX
    (benchmarks/attention_bench.py, the demo model, 2 threads; ARCHITECTURE §6)."""
    if cfg.flash_attn is not None:
        return cfg.flash_attn
    if auto_off and cfg.cache_type_k in UNQUANTIZED and cfg.cache_type_v in UNQUANTIZED:
        if n_seq > 1 and shape is not None:
            cells = replace(shape, cache_type_k=cfg.cache_type_k, cache_type_v=cfg.cache_type_v)
            return choose(cells, n_seq, cfg.n_threads).on
        return False
    return None


@dataclass(frozen=True)
class ContextSettings:
    """What the target context (and every drafter on it) is created with: a generation whose
    settings differ gets new contexts. Derived from the config and two facts of the model."""

    n_ctx: int
    n_batch: int
    n_threads: Optional[int]
    n_rs_seq: int  # recurrent targets keep exactly N snapshots for rollback (plain decoding: none)
    kv: lx.KvOptions
    n_seq: int = 1  # sequences (slots) it holds, each n_ctx / n_seq positions (llama-server's split, -np)

    @classmethod
    def of(
        cls,
        cfg: GenConfig,
        n_ctx_train: int,
        recurrent: bool,
        drafting: bool,
        n_seq: int = 1,
        flash_attn: Optional[bool] = None,
    ) -> ContextSettings:
        """`flash_attn`: as flash_attn_for resolved it (Runtime.flash_attn)."""
        n_rs = cfg.draft_n_max if (recurrent and drafting) else 0
        n_ubatch = cfg.n_ubatch
        if n_rs and n_ubatch is not None and n_ubatch <= n_rs + 1:
            # llama.cpp aborts (llama-batch.cpp split_equal: n_ubatch > n_keep_tail = n_rs_seq + 1)
            log.warning("n_ubatch %d raised to %d: the target keeps %d rollback snapshots", n_ubatch, n_rs + 2, n_rs)
            n_ubatch = n_rs + 2
        kv = lx.KvOptions(cfg.cache_type_k, cfg.cache_type_v, n_ubatch, flash_attn)
        n_ctx = cfg.n_ctx or n_ctx_train * n_seq  # (0: the model's training context per slot)
        n_batch = max(cfg.n_batch, cfg.draft_n_max + 2, n_seq * (cfg.draft_n_max + 1))  # (every slot's step fits)
        return cls(n_ctx, n_batch, cfg.n_threads, n_rs, kv, n_seq)


@dataclass
class Contexts:
    """The target context for one set of context settings, and one drafter per spec type and
    sequence on it."""

    key: ContextSettings
    target: lx.Context
    n_ctx: int  # usable positions per sequence (the smallest of the request and every context's actual size)
    drafters: dict[tuple[str, int], Drafter] = field(default_factory=dict)
    held: dict[int, Held] = field(default_factory=dict)  # by sequence: what its last generation left in memory
    # by sequence, while it generates: what its memory holds so far that stays (VerifyLoop.settled)
    live: dict[int, Callable[[], Held]] = field(default_factory=dict)
    costs: StepCosts = field(default_factory=StepCosts)  # verify passes on this context, as measured
    shared: dict[tuple[Any, ...], lx.Context] = field(default_factory=dict)  # drafter contexts all sequences share

    @classmethod
    def create(cls, model: lx.Model, key: ContextSettings) -> Contexts:
        tgt = lx.create_context(
            model,
            n_ctx=key.n_ctx,
            n_batch=key.n_batch,
            n_threads=key.n_threads,
            n_rs_seq=key.n_rs_seq,
            n_seq_max=key.n_seq,
            kv=key.kv,
        )
        on = key.kv.flash_attn
        fa = "llama.cpp's auto" if on is None else "on" if on else "off"
        log.info("target context: %d positions, %d sequence(s), flash attention %s", key.n_ctx, key.n_seq, fa)
        return cls(key, tgt, min(key.n_ctx // key.n_seq, lx.n_ctx_seq(tgt)))

    def offers(self, seq: int) -> dict[int, Held]:
        """What every other sequence's memory is known to hold, by sequence (memory.borrowed)."""
        out = {s: h for s, h in self.held.items() if s != seq}
        out.update((s, f()) for s, f in self.live.items() if s != seq)
        return out

    def drafter(self, cls: type[Drafter], seq: int, models: Models) -> Drafter:
        """The drafter of `cls` following sequence `seq` on these contexts, created once (a chain
        from its members' own)."""
        d = self.drafters.get((cls.name, seq))
        if d is None:
            if issubclass(cls, Chain):
                d = cls([self.drafter(m, seq, models) for m in cls.members])
            else:
                k = self.key
                plan = ContextPlan(
                    self.target, k.n_ctx, k.n_batch, k.n_threads, k.kv, self.costs, seq, k.n_seq, self.shared
                )
                d = cls.create(models, plan)
            d.seq = seq
            self.drafters[(cls.name, seq)] = d
            if d.n_ctx is not None:
                self.n_ctx = min(self.n_ctx, d.n_ctx)
        return d

    def close(self) -> None:
        for d in self.drafters.values():
            d.close()  # (a chain's members are here too: the chain closes nothing itself)
        self.drafters.clear()
        for c in self.shared.values():
            c.close()
        self.shared.clear()
        self.target.close()  # (a context still reading its memory is closed first)


__all__ = ["Contexts", "ContextSettings"]
