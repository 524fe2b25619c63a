"""Per-architecture knowledge: which archs llama.cpp runs an MTP graph for, and how heads are named.

Head blocks are the last `{arch}.nextn_predict_layers` blocks: `blk.{i}.*` with i >= n_trunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Archs whose llama.cpp model (vendored in llama-cpp-python 0.3.36) builds an LLM_GRAPH_TYPE_DECODER_MTP graph.
MTP_ARCHS = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "glm4moe", "glm-dsa", "glm5-next", "deepseek2", "deepseek32",
    "deepseek4", "step35", "mimo2", "bailingmoe3", "cohere2moe", "hy_v3", "nemotron_h_moe",
})

# Drafter models that carry no trunk of their own and read the target's KV cache.
ASSISTANT_ARCHS = frozenset({"gemma4-assistant"})

# Archs `mtp-cli adopt` can re-express as glm4moe.
ADOPTABLE_ARCHS = frozenset({"llama", "qwen2", "qwen3"})

NEXTN_SUFFIXES = ("eh_proj", "enorm", "hnorm", "embed_tokens", "shared_head_head", "shared_head_norm")
REQUIRED_NEXTN = ("eh_proj", "enorm", "hnorm")

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


def block_index(tensor_name: str) -> int | None:
    """The block number of a `blk.{i}.*` tensor, else None (token_embd, output, ...)."""
    m = _BLOCK_RE.match(tensor_name)
    return int(m.group(1)) if m else None


def rename_block(tensor_name: str, new_index: int) -> str:
    """`blk.7.attn_q.weight` -> `blk.{new_index}.attn_q.weight`."""
    return _BLOCK_RE.sub(f"blk.{new_index}.", tensor_name, count=1)


def is_nextn_tensor(tensor_name: str) -> bool:
    return ".nextn." in tensor_name


@dataclass(frozen=True)
class BlockLayout:
    """How a file's blocks split between trunk and MTP head."""

    block_count: int
    nextn_layers: int

    @property
    def n_trunk(self) -> int:
        return self.block_count - self.nextn_layers

    def is_head_block(self, index: int) -> bool:
        return index >= self.n_trunk

    def head_indices(self) -> range:
        return range(self.n_trunk, self.block_count)


def key(arch: str, name: str) -> str:
    """`key("qwen35", "block_count")` -> `qwen35.block_count`."""
    return f"{arch}.{name}"
