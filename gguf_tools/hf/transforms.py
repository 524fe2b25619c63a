"""What llama.cpp's converter does to a head tensor on its way from HF to GGUF: one `Step` per output.

Each step names the GGUF tensors it produces and loads them when asked (nothing is read while
planning): a tensor as it is (qwen's zero-centred norms +1, qwen.py:401-402), fused expert
matrices split (qwen.py:98-117), per-expert matrices stacked (qwen.py:119-143, glm.py:207-232,
deepseek.py:404-431), DeepSeek's kv_b split into k_b and v_b (deepseek.py:433-450).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gguf_tools.errors import MismatchError
from gguf_tools.hf.files import Catalog

GGUFName = Callable[[str], str]  # converted HF-style name -> GGUF name


@dataclass
class Step:
    bid: int
    outputs: list[str]  # GGUF names, in the order `load` returns them
    load: Callable[[], list[np.ndarray]]
    sources: list[str] = field(default_factory=list)


def simple_step(cat: Catalog, bid: int, gguf_name: str, orig: str, plus_one: bool) -> Step:
    return Step(bid, [gguf_name], _simple_loader(cat, orig, plus_one), [orig])


def _simple_loader(cat: Catalog, orig: str, plus_one: bool) -> Callable[[], list[np.ndarray]]:
    def load() -> list[np.ndarray]:
        data = cat.read(orig)
        if plus_one:
            data = data + data.dtype.type(1)
        return [data]

    return load


def fused_experts_step(cat: Catalog, bid: int, kind: str, new: str, orig: str, gguf_name: GGUFName) -> Step:
    """Qwen2MoeModel.modify_tensors, qwen.py:98-117 (transformers-v5 fused expert layout)."""
    shape = cat.shape(orig)
    if kind == "down_proj":
        # HF [n_expert, n_embd, n_ff] -> ne {n_ff, n_embd, n_expert}: kept as is
        name = new if new.endswith(".weight") else f"{new}.weight"
        return Step(bid, [gguf_name(name)], lambda: [cat.read(orig)], [orig])
    if len(shape) < 3 or shape[-2] % 2 != 0:
        raise MismatchError(f"unexpected gate_up_proj shape {list(shape)} for {orig!r}", cat.where[orig])
    base = new.removesuffix(".weight").removesuffix(".gate_up_proj")
    outs = [gguf_name(f"{base}.gate_proj.weight"), gguf_name(f"{base}.up_proj.weight")]

    def load() -> list[np.ndarray]:
        data = cat.read(orig)
        n_ff = data.shape[-2] // 2
        return [np.ascontiguousarray(data[..., :n_ff, :]), np.ascontiguousarray(data[..., n_ff:, :])]

    return Step(bid, outs, load, [orig])


def expert_steps(cat: Catalog, experts: dict[tuple[int, str], dict[int, str]], gguf_name: GGUFName) -> list[Step]:
    """Per-expert weights stacked on a new dim 0, expert 0 first (qwen.py:119-143, glm.py:207-232,
    deepseek.py:404-431): gate/up [n_ff, n_embd] -> [n_expert, n_ff, n_embd] = ne {n_embd, n_ff, n_expert}."""
    steps = []
    by_bid: dict[int, dict[str, dict[int, str]]] = {}
    for (bid, w), xs in experts.items():
        by_bid.setdefault(bid, {})[w] = xs
    for bid, ws in sorted(by_bid.items()):
        n_expert = 1 + max(x for xs in ws.values() for x in xs)
        for w in ("down_proj", "gate_proj", "up_proj"):
            xs = ws.get(w, {})
            absent = [x for x in range(n_expert) if x not in xs]
            if absent:
                raise MismatchError(
                    f"layer {bid}: expert {w} missing for expert(s) {absent[:8]} of {n_expert}",
                    cat.where[next(iter(xs.values()))] if xs else None,
                )
            names = [xs[x] for x in range(n_expert)]
            shapes = {cat.shape(n) for n in names}
            if len(shapes) != 1:
                raise MismatchError(f"layer {bid}: expert {w} shapes differ: {sorted(shapes)}", cat.where[names[0]])
            steps.append(
                Step(bid, [gguf_name(f"model.layers.{bid}.mlp.experts.{w}.weight")], _stack_loader(cat, names), names)
            )
    return steps


def _stack_loader(cat: Catalog, names: list[str]) -> Callable[[], list[np.ndarray]]:
    def load() -> list[np.ndarray]:
        out = None
        for i, n in enumerate(names):
            a = cat.read(n)
            if out is None:
                out = np.empty((len(names),) + a.shape, dtype=a.dtype)
            elif a.dtype != out.dtype:  # mixed f16/f32 experts: widen like torch.stack would
                out = out.astype(np.result_type(out.dtype, a.dtype))
            out[i] = a
        assert out is not None  # (names is never empty)
        return [out]

    return load


def _mla_dims(cat: Catalog, new: str, orig: str, renamed: dict[str, str]) -> tuple[int, int, int]:
    """(n_head_kv, qk_nope_head_dim, v_head_dim) for kv_b_proj, from config.json if present, else the layer's shapes."""
    rows, kv_lora = cat.shape(orig)[:2]
    cfg_path = cat.where[orig].parent / "config.json"
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            hp = {**cfg, **cfg.get("text_config", {})}
            n_kv = hp.get("num_key_value_heads") or hp["num_attention_heads"]
            nope, v = int(hp["qk_nope_head_dim"]), int(hp["v_head_dim"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        else:
            if rows != n_kv * (nope + v):  # deepseek.py:442
                raise MismatchError(
                    f"{orig!r} has {rows} rows, config.json says {n_kv} heads x ({nope} + {v})", cat.where[orig]
                )
            return int(n_kv), nope, v
    # n_head*(nope+rope) = q rows (A), n_head*v = o_proj cols (B), n_head*(nope+v) = kv_b rows (C),
    # kv_lora + rope = kv_a_proj_with_mqa rows  =>  n_head = (A - C + B) / rope
    prefix = new.removesuffix("kv_b_proj.weight")

    def shape_of(suffix: str):
        o = renamed.get(prefix + suffix)
        return None if o is None else cat.shape(o)

    q = shape_of("q_b_proj.weight") or shape_of("q_proj.weight")
    o = shape_of("o_proj.weight")
    kv_a = shape_of("kv_a_proj_with_mqa.weight")
    if q is None or o is None or kv_a is None:
        raise MismatchError(
            f"cannot split {orig!r}: no config.json next to it and the layer lacks "
            f"q_b_proj/q_proj, o_proj or kv_a_proj_with_mqa to infer head dims",
            cat.where[orig],
        )
    rope = kv_a[0] - kv_lora
    a, b, c = q[0], o[1], rows
    if rope <= 0 or (a - c + b) <= 0 or (a - c + b) % rope:
        raise MismatchError(f"cannot infer MLA head dims for {orig!r} from shapes", cat.where[orig])
    n_head = (a - c + b) // rope
    if (c - b) % n_head or b % n_head or (c - b) <= 0 or b <= 0:
        raise MismatchError(f"cannot infer MLA head dims for {orig!r} from shapes", cat.where[orig])
    return n_head, (c - b) // n_head, b // n_head


def kv_b_step(cat: Catalog, bid: int, new: str, orig: str, renamed: dict[str, str], gguf_name: GGUFName) -> Step:
    """DeepseekV2Model.modify_tensors, deepseek.py:433-450: kv_b [n_head*(nope+v), kv_lora] ->
    k_b [n_head, kv_lora, nope] (ne {nope, kv_lora, n_head}) and v_b [n_head, v, kv_lora] (ne {kv_lora, v, n_head})."""
    n_head, nope, v = _mla_dims(cat, new, orig, renamed)
    outs = [gguf_name(new.replace("kv_b_proj", "k_b_proj")), gguf_name(new.replace("kv_b_proj", "v_b_proj"))]

    def load() -> list[np.ndarray]:
        data = cat.read(orig)
        kv_b = data.reshape(n_head, nope + v, data.shape[-1])
        k_b = np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))
        v_b = np.ascontiguousarray(kv_b[:, nope:, :])
        return [k_b, v_b]

    return Step(bid, outs, load, [orig])
