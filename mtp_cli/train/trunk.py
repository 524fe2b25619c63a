"""The frozen trunk, as the head sees it: tensors read from the GGUF and dequantized (numpy).

The head reuses the trunk's token embedding, its output norm and its output matrix (tied to the
embedding when the file has no `output.weight`), all frozen. Its trainable block can start from
the trunk's last block (same shapes) or from the head slot the file already has.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_tools import step35_head
from gguf_tools.adopt_step35 import adopted as adopted_step35
from gguf_tools.errors import RefusedError
from gguf_tools.gguf_file import GGUFFile, open_gguf
from gguf_tools.glm4moe_head import BLOCK_NAMES, SHEXP, HeadDims, random_weights, unpack_head_block
from gguf_tools.names import ADOPT_TARGET, OUTPUT_NORM, TOKEN_EMBD

ARCH = ADOPT_TARGET

# trunk block tensor suffix -> the head's short weight name (glm4moe_head's names)
_BLOCK_NAMES = (
    {suffix: short for short, suffix in BLOCK_NAMES.items()}
    | {f"ffn_{k}.weight": f"ffn_{k}" for k in ("gate", "up", "down")}
    | {"ffn_norm.weight": "post_attention_norm"}
)  # (a step35 trunk's blocks name it as llama does)


@dataclass(frozen=True)
class TrunkParams:
    """What the head needs to know about the trunk: dims, norms' epsilon, rope."""

    path: Path
    dims: HeadDims
    n_trunk: int
    n_vocab: int
    eps: float
    n_rot: int
    rope_base: float
    rope_scale: float  # ggml's freq_scale (1 / linear scaling factor)
    has_head_slot: bool
    tied_output: bool
    # step35 (an adopted Llama 3.x): the h handed on is taken before the output norm, the head's
    # rope has no factors (its block is the sliding-window one)
    h_prenorm: bool = False

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> TrunkParams:
        step35 = adopted_step35(gf)  # (adopt_step35's dense head)
        if gf.arch != ARCH and not step35:
            raise RefusedError(
                f"training needs a glm4moe trunk (adopt a llama/qwen2/qwen3 one first), not {gf.arch!r}", gf.path
            )
        lay = gf.layout()
        if lay.nextn_layers > 1:
            raise RefusedError(f"has {lay.nextn_layers} head blocks; glm4moe's MTP graph runs exactly one", gf.path)
        dims = HeadDims.from_gguf(gf)
        n_rot = int(gf.arch_get("rope.dimension_count_swa" if step35 else "rope.dimension_count", dims.head_dim))
        factor = None if step35 else gf.arch_get("rope.scaling.factor")
        scaling = gf.arch_get("rope.scaling.type")
        if scaling not in (None, "none", "linear"):
            raise RefusedError(f"rope scaling {scaling!r} is not supported by the trainer's head", gf.path)
        n_vocab = gf.n_vocab()
        if n_vocab is None:
            raise RefusedError("has no token embedding", gf.path)
        return cls(
            Path(gf.path),
            dims,
            lay.n_trunk,
            int(n_vocab),
            float(gf.arch_get("attention.layer_norm_rms_epsilon")),
            n_rot,
            float(
                gf.arch_get("rope.freq_base_swa" if step35 else "rope.freq_base") or gf.arch_get("rope.freq_base", 1e4)
            ),
            1.0 / float(factor) if factor else 1.0,
            lay.nextn_layers == 1,
            gf.output_name == TOKEN_EMBD,
            h_prenorm=step35,
        )


class Trunk:
    """An opened glm4moe GGUF and its frozen tensors (read on demand)."""

    def __init__(self, path: str | Path, gf: GGUFFile | None = None):
        self.gf = gf if gf is not None else open_gguf(path)
        self.params = TrunkParams.from_gguf(self.gf)

    def tensor(self, name: str) -> np.ndarray:
        return self.gf.read_f32(name)

    def embed(self) -> np.ndarray:
        return self.tensor(TOKEN_EMBD)

    def output(self) -> np.ndarray:
        """The output matrix (V, E): `output.weight`, or the tied embedding."""
        return self.tensor(self.gf.output_name)

    def output_norm(self) -> np.ndarray:
        return self.tensor(OUTPUT_NORM)

    def last_block(self) -> dict[str, np.ndarray]:
        """The trunk's last block as the head's short-named weights (same shapes as a head block)."""
        p = f"blk.{self.params.n_trunk - 1}."
        out = {short: self.tensor(p + suf) for suf, short in _BLOCK_NAMES.items() if p + suf in self.gf.tensors}
        if "ffn_gate" not in out:
            raise RefusedError(f"block {self.params.n_trunk - 1} has no dense FFN to start the head from", self.gf.path)
        return out

    def head_slot(self) -> dict[str, np.ndarray] | None:
        """The head block the file already has (short-named), or None."""
        if not self.params.has_head_slot:
            return None
        i = self.params.n_trunk
        arrays = {n: self.tensor(n) for n in self.gf.tensors if n.startswith(f"blk.{i}.")}
        return step35_head.unpack_head_block(arrays, i) if self.params.h_prenorm else unpack_head_block(arrays, i)


def initial_weights(trunk: Trunk, init: str, seed: int = 0, shared_expert: bool = False) -> dict[str, np.ndarray]:
    """The head's starting weights: "trunk" (a copy of the trunk's last block, eh_proj = [I | I]),
    "slot" (the file's own head block) or "random" (glm4moe_head's N(0, 1/fan_in) init).
    `shared_expert`: train glm4moe's shared expert as the second half of a twice-as-wide MLP (it runs
    at decode time anyway; off by default: no gain measured yet, each step is slower); it starts at
    zero output (down projection zero). "slot" keeps whatever the slot has."""
    p = trunk.params
    E = p.dims.n_embd
    if init == "slot":
        w = trunk.head_slot()
        if w is None:
            raise RefusedError("has no head slot to start from (init 'slot')", trunk.gf.path)
    elif init == "random":
        w = random_weights(p.dims, seed)
    elif init == "trunk":
        w = random_weights(p.dims, seed)
        w.update(trunk.last_block())
        w["eh_proj"] = np.concatenate([np.eye(E, dtype=np.float32), np.eye(E, dtype=np.float32)], axis=1)
    else:
        raise ValueError(f"unknown init {init!r} (trunk, slot, random)")
    w = {k: np.array(v, dtype=np.float32) for k, v in w.items()}
    if init != "slot":  # (a slot keeps its shared expert when it has a trained one)
        w = {k: v for k, v in w.items() if k not in SHEXP}
        if shared_expert and p.h_prenorm:
            raise RefusedError("step35's head block has no shared expert to train", trunk.gf.path)
        if shared_expert:
            rng = np.random.default_rng([seed, 7])
            F, E = w["ffn_gate"].shape
            w["ffn_gate_shexp"] = (rng.standard_normal((F, E)) / np.sqrt(E)).astype(np.float32)
            w["ffn_up_shexp"] = (rng.standard_normal((F, E)) / np.sqrt(E)).astype(np.float32)
            w["ffn_down_shexp"] = np.zeros((E, F), np.float32)
    w.setdefault("shared_head_norm", trunk.output_norm())
    return w


__all__ = ["TrunkParams", "Trunk", "initial_weights", "ARCH"]
