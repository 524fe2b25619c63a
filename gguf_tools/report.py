"""`inspect`: what a GGUF holds as far as MTP is concerned, and what to do about it."""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gguf_tools.adopt import PROVENANCE_KEY
from gguf_tools.adopt_step35 import TARGET as STEP35
from gguf_tools.adopt_step35 import blocker as adopt_blocker
from gguf_tools.adopt_step35 import wants_step35
from gguf_tools.archs import record
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.loadable import problems
from gguf_tools.names import ADOPTABLE_ARCHS, ASSISTANT_ARCHS, ASSISTANT_FOR, MTP_ARCHS, TOKEN_EMBD
from gguf_tools.surgery import head_tensors

# Verdicts
FULL = "full"  # trunk + head: runs with --spec-type mtp as it is
TRUNK_ONLY = "trunk-only"  # an MTP arch whose head is missing
SIDECAR = "mtp-sidecar"  # head blocks only: load with -md, or pack into its trunk
ASSISTANT = "assistant-drafter"  # a separate drafter that reads the target's KV cache
NO_MTP_GRAPH = "no-mtp-graph"  # llama.cpp has no MTP graph for this arch
INVALID = "invalid"  # llama.cpp would refuse it, or crash on it (gguf_tools.loadable)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    shape: list[int]
    bytes: int


@dataclass
class InspectReport:
    path: str
    file_bytes: int
    arch: str
    name: str | None
    block_count: int
    trunk_blocks: int
    head_blocks: int
    n_embd: int | None
    n_vocab: int | None
    tensor_count: int
    tensor_types: dict[str, int]
    head_tensors: list[TensorInfo] = field(default_factory=list)
    head_bytes: int = 0
    verdict: str = ""
    advice: str = ""
    adoptable: bool = False  # `mtp-cli adopt` can re-express it (as glm4moe, or step35 for llama 3)
    adopt_blocker: str | None = None  # why an llama/qwen2/qwen3 file cannot be adopted
    adopted_from: str | None = None  # the source arch of a file `mtp-cli adopt` wrote
    problems: list[str] = field(default_factory=list)  # why llama.cpp would not load it (verdict "invalid")

    @property
    def head_share(self) -> float:
        return self.head_bytes / self.file_bytes if self.file_bytes else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["head_share"] = self.head_share
        return d


def inspect_file(path: str | Path) -> InspectReport:
    return inspect_gguf(open_gguf(path))


def inspect_gguf(gf: GGUFFile) -> InspectReport:
    found = problems(gf.scan)
    if found:
        return _invalid(gf, [p.line() for p in found])
    lay = gf.layout()
    heads = head_tensors(gf)
    rep = InspectReport(
        path=str(gf.path),
        file_bytes=gf.size,
        arch=gf.arch,
        name=gf.get("general.name"),
        block_count=lay.block_count,
        trunk_blocks=lay.n_trunk,
        head_blocks=lay.nextn_layers,
        n_embd=gf.arch_get("embedding_length"),
        n_vocab=gf.n_vocab(),
        tensor_count=len(gf.tensors),
        tensor_types=dict(Counter(t.type.name for t in gf.tensors.values()).most_common()),
        head_tensors=[TensorInfo(t.name, t.type.name, list(t.shape), t.n_bytes) for t in heads],
        head_bytes=sum(t.n_bytes for t in heads),
        adopted_from=gf.get(PROVENANCE_KEY),
    )
    if gf.arch in ADOPTABLE_ARCHS:
        rep.adopt_blocker = adopt_blocker(gf)
        rep.adoptable = rep.adopt_blocker is None
    rep.verdict, rep.advice = _verdict(gf, rep)
    return rep


def _invalid(gf: GGUFFile, lines: list[str]) -> InspectReport:
    """What can be said safely about a file llama.cpp would not load: no layout is trusted."""
    n = gf.arch_get("block_count", 0)
    return InspectReport(
        path=str(gf.path),
        file_bytes=gf.size,
        arch=gf.arch,
        name=gf.get("general.name") if isinstance(gf.get("general.name"), str) else None,
        block_count=n if isinstance(n, int) else 0,
        trunk_blocks=0,
        head_blocks=0,
        n_embd=None,
        n_vocab=None,
        tensor_count=len(gf.tensors),
        tensor_types=dict(Counter(t.type.name for t in gf.tensors.values()).most_common()),
        verdict=INVALID,
        advice=lines[0],
        problems=lines,
    )


def _verdict(gf: GGUFFile, rep: InspectReport) -> tuple[str, str]:
    name = shlex.quote(str(gf.path))  # the whole path, quoted: advice is pasted into a shell
    if gf.arch in ASSISTANT_ARCHS:
        return ASSISTANT, f"a drafter for its target model: mtp-cli generate -m TARGET.gguf -md {name} --spec-type mtp"
    if gf.arch not in MTP_ARCHS:
        return NO_MTP_GRAPH, _no_graph_advice(gf, rep, name)
    if rep.head_blocks and rep.head_tensors and not gf.has_trunk:
        if TOKEN_EMBD not in gf.tensors:  # `extract --head-only`: llama.cpp cannot load it as -md
            return (
                SIDECAR,
                f"head blocks only (no token embedding): graft it: mtp-cli pack TRUNK.gguf --heads {name} -o OUT.gguf",
            )
        return SIDECAR, (
            f"MTP-only sidecar: pass it as -md {name} with --spec-type mtp, "
            f"or graft it: mtp-cli pack TRUNK.gguf --heads {name} -o OUT.gguf"
        )
    if rep.head_blocks and rep.head_tensors:
        return FULL, f"ready: mtp-cli generate -m {name} --spec-type mtp"
    missing = " (the key declares head blocks but the file holds no head tensors)" if rep.head_blocks else ""
    if rep.adopted_from:
        return TRUNK_ONLY, (
            f"a {rep.adopted_from} trunk adopted as {gf.arch}, with no MTP head{missing}: no published "
            f"head fits it; train one, which packs it too: mtp-cli train {name} -o OUT.gguf"
        )
    rec = record(gf.arch)
    if rec is not None and rec.hf_family in ("nextn", "nextn-mla"):  # convert_hf_to_gguf.py --mtp refuses these
        source = "the HF checkpoint's safetensors (its model.layers.N MTP blocks)"
    else:
        source = (
            "an MTP sidecar (convert_hf_to_gguf.py --mtp, or mtp-cli extract on a full GGUF), "
            "or the HF checkpoint's safetensors"
        )
    return TRUNK_ONLY, f"no MTP head{missing}. Graft one from {source}: mtp-cli pack {name} --heads SOURCE -o OUT.gguf"


def _no_graph_advice(gf: GGUFFile, rep: InspectReport, name: str) -> str:
    why = f"llama.cpp has no MTP graph for architecture {gf.arch!r}"
    if gf.arch in ASSISTANT_FOR:
        return (
            f"{why}: it drafts with a separate {ASSISTANT_FOR[gf.arch]} model (Google's MTP drafter for "
            f"it, converted by llama.cpp's convert_hf_to_gguf.py): mtp-cli generate -m {name} "
            "-md ASSISTANT.gguf --spec-type mtp"
        )
    if rep.adoptable:
        target = STEP35 if wants_step35(gf) else "glm4moe"
        return why + f"; it can be re-expressed exactly as {target}, which has one: mtp-cli adopt {name} -o OUT.gguf"
    if rep.adopt_blocker:
        return (
            why
            + f"; mtp-cli adopt refuses it ({rep.adopt_blocker}); use --spec-type ngram or a draft model (-md) instead"
        )
    return why + "; use --spec-type ngram or a draft model (-md) instead"
