"""Architectures: one record per llama.cpp architecture mtp-cli knows a fact about (llama.cpp as
llama-cpp-python 0.3.36 vendors it), and the sets every check selects from by trait.

Adding an MTP architecture is one record here: the limits (gguf_tools.limits), the key and hparam
checks (gguf_tools.loadable), safetensors heads (gguf_tools.hf), pack/strip/adopt (gguf_tools.surgery,
adopt) and the runtime read these sets when they run, not copies made at import
(tests/test_archs.py registers a fake record and sees each of them pick it up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Set
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal, Optional

HfFamily = Literal["qwen", "nextn", "nextn-mla"]
# Where the MTP graph takes its h output (t_h_nextn): "all_rows" before selecting the output rows
# (so the unmasked extraction holds every batch row, by batch index), "output_rows" after (masked:
# by output index; unmasked aborts); None: not read from its graph, every row is made an output.
NextnH = Optional[Literal["all_rows", "output_rows"]]


@dataclass(frozen=True)
class ArchRecord:
    name: str
    mtp_graph: bool = False  # its llama.cpp model builds an LLM_GRAPH_TYPE_DECODER_MTP graph
    nextn_h: NextnH = None  # how that graph hands out h (src/models/{arch}.cpp, graph_mtp)
    one_head_block: bool = False  # that graph takes a single MTP block (glm4-moe.cpp:135, qwen35, deepseek2)
    dense_lead: bool = False  # MoE after leading_dense_block_count: the head block must lie past it
    recurrent: bool = False  # gated-delta-net hybrid (qwen35.cpp): rollback needs n_rs_seq snapshots
    mrope: bool = False  # rope.dimension_sections (multi-section rope)
    sections_required: bool = False  # ... and the key must be there (qwen35.cpp)
    per_layer_heads: bool = False  # head counts may vary per block (its graph reads each block's)
    rms: bool = False  # reads attention.layer_norm_rms_epsilon
    rope_half: bool = False  # NEOX rope: 0 < n_rot <= head dim, even (ops.cpp aborts, 0 hangs)
    rope_exact: bool = False  # n_rot must equal the head dim (llama-model.cpp:1450)
    head_dims_equal: bool = False  # key_length = value_length
    expert_gating: bool = False  # expert_gating_func is read and must be known
    swa_pattern: bool = False  # sliding_window_pattern marks the sliding-window layers
    required: tuple[str, ...] = ()  # further {arch}.* keys its loader requires
    hf_family: Optional[HfFamily] = None  # how its HF checkpoints store MTP heads (gguf_tools.hf)
    adoptable: bool = False  # `mtp-cli adopt` re-expresses it as ADOPT_TARGET
    assistant: Optional[str] = None  # the drafter arch that reads its KV cache (-md, draft-mtp)
    is_assistant: bool = False  # a drafter with no trunk of its own


_LLAMA = ArchRecord("llama", rms=True, rope_exact=True, head_dims_equal=True, adoptable=True)
_QWEN35 = ArchRecord(
    "qwen35",
    sections_required=True,
    mtp_graph=True,
    nextn_h="all_rows",
    one_head_block=True,
    recurrent=True,
    mrope=True,
    rms=True,
    rope_half=True,
    head_dims_equal=True,
    hf_family="qwen",
    required=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count"),
)
_SWA = ("attention.sliding_window", "attention.key_length_swa", "attention.value_length_swa")

RECORDS: dict[str, ArchRecord] = {
    r.name: r
    for r in (
        _LLAMA,
        replace(_LLAMA, name="qwen2"),
        replace(_LLAMA, name="qwen3"),
        _QWEN35,
        replace(_QWEN35, name="qwen35moe"),
        replace(_QWEN35, name="qwen3next", sections_required=False, nextn_h=None),
        ArchRecord(
            "glm4moe",
            mtp_graph=True,
            nextn_h="all_rows",
            one_head_block=True,
            dense_lead=True,
            rms=True,
            rope_half=True,
            head_dims_equal=True,
            expert_gating=True,
            hf_family="nextn",
            required=("expert_feed_forward_length", "expert_shared_count"),
        ),
        ArchRecord(
            "deepseek2",
            mtp_graph=True,
            nextn_h="all_rows",
            one_head_block=True,
            dense_lead=True,
            rms=True,
            rope_half=True,
            expert_gating=True,
            hf_family="nextn-mla",
            required=("attention.kv_lora_rank", "expert_feed_forward_length", "expert_shared_count"),
        ),
        ArchRecord(
            "mimo2",
            mtp_graph=True,
            nextn_h="output_rows",
            per_layer_heads=True,
            rms=True,
            rope_half=True,
            swa_pattern=True,
            required=("attention.sliding_window", "expert_feed_forward_length"),
        ),
        ArchRecord(
            "step35",
            mtp_graph=True,
            nextn_h="output_rows",
            per_layer_heads=True,
            rms=True,
            expert_gating=True,
            swa_pattern=True,
            required=("attention.sliding_window", "expert_feed_forward_length"),
        ),
        *(
            ArchRecord(a, mtp_graph=True, nextn_h="all_rows")
            for a in ("glm-dsa", "deepseek32", "bailingmoe3", "cohere2moe")
        ),
        *(ArchRecord(a, mtp_graph=True) for a in ("glm5-next", "deepseek4", "hy_v3", "nemotron_h_moe")),
        ArchRecord(
            "gemma4",
            per_layer_heads=True,
            rms=True,
            rope_half=True,
            assistant="gemma4-assistant",
            required=(*_SWA, "embedding_length_per_layer_input"),
        ),
        ArchRecord(
            "gemma4-assistant", per_layer_heads=True, rms=True, rope_half=True, is_assistant=True, required=_SWA
        ),
    )
}

ADOPT_TARGET = "glm4moe"  # what adopt re-expresses an adoptable trunk as


class ArchSet(Set[str]):
    """The names of the records with a trait, read from RECORDS whenever asked (in table order)."""

    def __init__(self, trait: Callable[[ArchRecord], bool]):
        self._trait = trait

    def __contains__(self, arch: object) -> bool:
        rec = RECORDS.get(arch) if isinstance(arch, str) else None
        return rec is not None and bool(self._trait(rec))

    def __iter__(self) -> Iterator[str]:
        return (n for n, r in RECORDS.items() if self._trait(r))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"ArchSet({', '.join(self)})"


def having(field: str) -> ArchSet:
    """The archs whose record sets `field` (a bool trait, or a value that is not None)."""
    return ArchSet(lambda r: getattr(r, field) not in (False, None, ()))


class _AssistantFor(Mapping[str, str]):
    """target arch -> the assistant arch that drafts for it."""

    def __getitem__(self, arch: str) -> str:
        rec = RECORDS.get(arch)
        if rec is None or rec.assistant is None:
            raise KeyError(arch)
        return rec.assistant

    def __iter__(self) -> Iterator[str]:
        return (n for n, r in RECORDS.items() if r.assistant)

    def __len__(self) -> int:
        return sum(1 for _ in self)


MTP_ARCHS = having("mtp_graph")
RECURRENT_ARCHS = having("recurrent")
ASSISTANT_ARCHS = having("is_assistant")
ASSISTANT_FOR: Mapping[str, str] = _AssistantFor()
ADOPTABLE_ARCHS = having("adoptable")
HF_HEAD_ARCHS = having("hf_family")


def record(arch: str) -> Optional[ArchRecord]:
    return RECORDS.get(arch)


def nextn_h_of(arch: str) -> NextnH:
    """How `arch`'s MTP graph hands out h (None: the table does not say)."""
    rec = RECORDS.get(arch)
    return rec.nextn_h if rec is not None else None


def is_(arch: str, trait: str) -> bool:
    """Whether `arch` has a record with `trait` set."""
    return arch in having(trait)


@contextmanager
def registered(rec: ArchRecord) -> Iterator[ArchRecord]:
    """One more record for the duration (tests: a new architecture reaches every check)."""
    before = RECORDS.get(rec.name)
    RECORDS[rec.name] = rec
    try:
        yield rec
    finally:
        if before is None:
            del RECORDS[rec.name]
        else:
            RECORDS[rec.name] = before


__all__ = [
    "ADOPTABLE_ARCHS",
    "ADOPT_TARGET",
    "ASSISTANT_ARCHS",
    "ASSISTANT_FOR",
    "ArchRecord",
    "ArchSet",
    "HF_HEAD_ARCHS",
    "MTP_ARCHS",
    "RECORDS",
    "RECURRENT_ARCHS",
    "having",
    "is_",
    "nextn_h_of",
    "record",
    "registered",
]
