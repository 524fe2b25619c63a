"""Names: head tensors and head types (the architectures: gguf_tools.archs).

Head blocks are the last `{arch}.nextn_predict_layers` blocks: `blk.{i}.*` with i >= n_trunk. Each
holds the block's ordinary attention/FFN tensors plus `blk.{i}.nextn.{part}.weight` for the parts
below (ARCHITECTURE §3); llama.cpp tells an MTP-only sidecar by the absence of TRUNK_MARKER.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gguf import GGMLQuantizationType

# Architecture facts: one record per arch in gguf_tools.archs (re-exported here for the modules
# that import them by these names; the sets are live views of that table).
from gguf_tools.archs import ADOPT_TARGET, ADOPTABLE_ARCHS, ASSISTANT_ARCHS, ASSISTANT_FOR, MTP_ARCHS  # noqa: F401

# ---- tensors -----------------------------------------------------------------------------------

TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"
OUTPUT_NORM = "output_norm.weight"
TRUNK_MARKER = "blk.0.attn_norm.weight"  # llama.cpp: a file with head blocks but without it is MTP-only
# Top-level tensors an MTP-only sidecar carries besides its head blocks (as `convert_hf_to_gguf.py --mtp`).
SIDECAR_SHARED = (TOKEN_EMBD, OUTPUT_NORM, OUTPUT)

NEXTN_PARTS = ("eh_proj", "enorm", "hnorm", "embed_tokens", "shared_head_head", "shared_head_norm")
REQUIRED_NEXTN = ("eh_proj", "enorm", "hnorm")  # the rest are optional: the trunk's are used
OWN_OUTPUT = "shared_head_head"  # a head-owned output matrix

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


def nextn_suffix(part: str) -> str:
    """`nextn.eh_proj.weight`: a nextn tensor's name after `blk.{i}.`."""
    return f"nextn.{part}.weight"


def nextn_name(block: int, part: str) -> str:
    """`blk.{block}.nextn.{part}.weight`."""
    return f"blk.{block}.{nextn_suffix(part)}"


def nextn_shapes(n_embd: int, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """The ggml shapes llama.cpp demands of each nextn tensor (qwen35.cpp, glm4-moe.cpp), by suffix."""
    shapes = {
        "eh_proj": (2 * n_embd, n_embd),
        "enorm": (n_embd,),
        "hnorm": (n_embd,),
        "shared_head_norm": (n_embd,),
        "embed_tokens": (n_embd, n_vocab),
        "shared_head_head": (n_embd, n_vocab),
    }
    return {nextn_suffix(p): s for p, s in shapes.items()}


def block_index(tensor_name: str) -> int | None:
    """The block number of a `blk.{i}.*` tensor, else None (token_embd, output, ...)."""
    m = _BLOCK_RE.match(tensor_name)
    return int(m.group(1)) if m else None


def block_suffix(tensor_name: str) -> str:
    """`blk.7.attn_q.weight` -> `attn_q.weight`; a tensor outside the blocks keeps its name."""
    return tensor_name.split(".", 2)[2] if block_index(tensor_name) is not None else tensor_name


def rename_block(tensor_name: str, new_index: int) -> str:
    """`blk.7.attn_q.weight` -> `blk.{new_index}.attn_q.weight`."""
    return _BLOCK_RE.sub(f"blk.{new_index}.", tensor_name, count=1)


# ---- head types ------------------------------------------------------------------------------

# Types a float head matrix may be converted to (norms, biases and routers stay F32).
HEAD_TYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
}
TRAINED_HEAD_TYPES = ("f16", "q8_0", "f32")  # what `train` writes a head block's matrices as
# A head-owned, full-vocabulary copy of the trunk's output matrix (nextn.shared_head_head).
OWN_OUTPUT_TYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0}
FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)

# ---- key-values ------------------------------------------------------------------------------

# Per-layer array keys llama.cpp reads with n_layer_all entries (get_key_or_arr / get_arr).
PER_LAYER_KEYS = (
    "feed_forward_length",
    "expert_feed_forward_length",
    "expert_used_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.recurrent_layers",
    "attention.sliding_window_pattern",
    "attention.rope_pattern",
    "attention.compress_ratios",
    "attention.indexer_types",
    "swiglu_clamp_exp",
    "swiglu_clamp_shexp",
)
# Hyperparameters a head must share with the trunk it is grafted onto.
MATCH_KEYS = (
    "embedding_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "expert_count",
    "expert_used_count",
    "expert_shared_count",
    "expert_feed_forward_length",
    "attention.layer_norm_rms_epsilon",
)


def key(arch: str, name: str) -> str:
    """`key("qwen35", "block_count")` -> `qwen35.block_count`."""
    return f"{arch}.{name}"


@dataclass(frozen=True)
class BlockLayout:
    """How a file's blocks split between trunk and MTP head."""

    block_count: int
    nextn_layers: int

    @property
    def n_trunk(self) -> int:
        return self.block_count - self.nextn_layers
