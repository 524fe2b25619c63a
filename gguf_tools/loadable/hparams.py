"""Hyperparameters llama.cpp asserts on: the generic ones (src/llama-model.cpp load_hparams) and
each architecture's (src/models/*.cpp); gguf_tools.limits cites each rule."""

from __future__ import annotations

from collections.abc import Iterator

from gguf import GGUFValueType as T

from gguf_tools.archs import is_
from gguf_tools.limits import EXPERT_GATING_FUNCS, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS, ROPE_SCALING_TYPES
from gguf_tools.loadable.header import Header, Problem, check, problem

_UNIFORM = (
    "attention.head_count",
    "attention.head_count_kv",
    "feed_forward_length",
    "expert_used_count",
    "expert_feed_forward_length",
)


@check
def layers(h: Header) -> Iterator[Problem]:
    n, k = h.n_layers, h.key("block_count")
    if h.has("block_count") and not 0 < n <= LLAMA_MAX_LAYERS:
        yield problem("block-count", k, f"{k} = {n}, llama.cpp's limit is 1 to {LLAMA_MAX_LAYERS} blocks")
    if h.n_nextn > n:
        kn = h.key("nextn_predict_layers")
        yield problem("nextn-layers", kn, f"{kn} = {h.n_nextn} is more than {k} = {n}")


@check
def experts(h: Header) -> Iterator[Problem]:
    x, ku = h.u32("expert_count"), h.key("expert_used_count")
    used = max(h.per_layer("expert_used_count"), default=0)
    groups, g_used = h.u32("expert_group_count"), h.u32("expert_group_used_count")
    kx, kg, kgu = h.key("expert_count"), h.key("expert_group_count"), h.key("expert_group_used_count")
    if x > LLAMA_MAX_EXPERTS:
        yield problem("expert-count", kx, f"{kx} = {x}, llama.cpp's limit is {LLAMA_MAX_EXPERTS}")
    if used > x:
        yield problem("experts-used", ku, f"{ku} = {used} is more than {kx} = {x}")
    elif x > 0 and used == 0:
        yield problem("experts-used", ku, f"{kx} = {x} but {ku} is 0")
    if x > 0 and groups >= x:
        yield problem("expert-groups", kg, f"{kg} = {groups} is not below {kx} = {x}")
    elif x > 0 and groups > 1 and (x % groups or not 0 < g_used < groups):
        yield problem(
            "expert-groups",
            kgu,
            f"{kx} = {x}, {kg} = {groups}, {kgu} = {g_used}: groups must divide "
            "the experts and 0 < groups used < groups",
        )
    elif x == 0 and groups:
        yield problem("expert-groups", kg, f"{kg} = {groups} without experts")


@check
def attention(h: Header) -> Iterator[Problem]:
    heads, kv = h.per_layer("attention.head_count"), h.kv_heads()
    recr = recurrent_blocks(h) if is_(h.arch, "recurrent") else None
    for il, (a, b) in enumerate(zip(heads, kv)):
        if recr is not None and il < len(recr) and recr[il]:
            continue  # a recurrent block has no attention
        if a and (b == 0 or a % b):
            k = h.key("attention.head_count_kv")
            yield problem(
                "head-groups",
                k,
                f"{h.key('attention.head_count')} = {a} is not a multiple of {k} = {b}"
                + (f" (block {il})" if len(set(heads)) > 1 or len(set(kv)) > 1 else ""),
            )
            break
    if not is_(h.arch, "per_layer_heads"):
        for name in _UNIFORM:
            vals = h.ints(name)
            if vals is not None and recr is not None:  # recurrent blocks may say 0
                vals = [v for i, v in enumerate(vals) if i >= len(recr) or not recr[i]]
            if vals is not None and len(set(vals)) > 1:
                k = h.key(name)
                yield problem(
                    "layer-arrays-uniform",
                    k,
                    f"{k} varies per block ({sorted(set(vals))}); llama.cpp builds every {h.arch} block from block 0's",
                )
    elif (vals := h.ints("expert_used_count")) is not None and len(set(vals)) > 1:
        k = h.key("expert_used_count")
        yield problem("layer-arrays-uniform", k, f"{k} varies per block ({sorted(set(vals))})")
    for name in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        eps = h.scalar(name, T.FLOAT32)
        if eps is not None and not eps >= 0:
            yield problem("rms-eps", h.key(name), f"{h.key(name)} = {eps}, it must be >= 0")


@check
def rope(h: Header) -> Iterator[Problem]:
    st = h.scalar("rope.scaling.type", T.STRING)
    if st is not None and st not in ROPE_SCALING_TYPES:
        k = h.key("rope.scaling.type")
        yield problem("rope-scaling-type", k, f"{k} = {st!r}, llama.cpp knows {', '.join(ROPE_SCALING_TYPES)}")
    dk, dv, n_rot = h.head_dims()
    kr = h.key("rope.dimension_count")
    if is_(h.arch, "rope_exact") and h.per_layer("attention.head_count")[0] and n_rot != dk:
        yield problem("rope-dims-exact", kr, f"{kr} = {n_rot}, {h.arch} needs the head dimension, {dk}")
    elif h.arch != "deepseek2" and dk and not (0 < n_rot <= dk and n_rot % 2 == 0):
        yield problem("rope-dims", kr, f"{kr} = {n_rot}, it must be even and 1 to the head dimension {dk}")
    if dk != dv:
        k = h.key("attention.value_length")
        yield problem("head-dims-equal", k, f"{k} = {dv} differs from {h.key('attention.key_length')} = {dk}")
    yield from _sections(h, dk)


def _sections(h: Header, dk: int) -> Iterator[Problem]:
    k = h.key("rope.dimension_sections")
    s = h.ints("rope.dimension_sections")
    if s is None:
        if is_(h.arch, "sections_required") and not h.has("rope.dimension_sections"):
            yield problem("required-key", k, f"{k} is missing")
        return
    if len(s) != 4:
        yield problem("layer-array-length", k, f"{k} has {len(s)} entries, llama.cpp reads 4")
        return
    multi = is_(h.arch, "mrope") or (h.arch == "glm4moe" and s[0] > 0 and s[1] > 0)
    if multi and not (max(s[:3]) > 0 and 0 < sum(s) <= dk):
        yield problem("rope-sections", k, f"{k} = {s}: the sections must sum to 1..{dk} (the head dimension)")


@check
def per_arch(h: Header) -> Iterator[Problem]:
    gating = h.u32("expert_gating_func")
    if is_(h.arch, "expert_gating") and gating not in EXPERT_GATING_FUNCS:
        k = h.key("expert_gating_func")
        yield problem("expert-gating", k, f"{k} = {gating}, llama.cpp knows 1 to 4")
    if h.arch == "glm4moe":
        if h.u32("expert_count") == 0 or h.per_layer("expert_used_count")[0] == 0:
            k = h.key("expert_count")
            yield problem("glm4moe-experts", k, f"{k} and expert_used_count must be > 0 for glm4moe")
    if is_(h.arch, "recurrent"):
        yield from _ssm(h)
    if h.arch in ("gemma4", "gemma4-assistant"):
        yield from _gemma4(h)
    if h.arch == "deepseek2":
        yield from _deepseek2(h)
    if is_(h.arch, "swa_pattern"):
        yield from _swa(h)


def recurrent_blocks(h: Header) -> list[bool] | None:
    """Which blocks are recurrent, as qwen35's loader decides (src/models/qwen35.cpp:17-23); None
    when full_attention_interval is 0 (llama.cpp divides by it)."""
    flags = h.ints("attention.recurrent_layers")
    if flags is not None:
        return [bool(f) for f in flags]
    interval, n_trunk = h.u32("full_attention_interval", 4), h.n_layers - h.n_nextn
    if interval == 0:
        return None
    return [i < n_trunk and (i + 1) % interval != 0 for i in range(h.n_layers)]


def _ssm(h: Header) -> Iterator[Problem]:
    recr = recurrent_blocks(h)
    if recr is None:
        k = h.key("full_attention_interval")
        yield problem("recurrent-interval", k, f"{k} = 0")
    elif not (any(recr) and not all(recr[: h.n_layers - h.n_nextn])):
        k = h.key("full_attention_interval")
        yield problem(
            "hybrid-layers",
            k,
            f"{k} = {h.u32('full_attention_interval', 4)} makes "
            + ("no" if not any(recr) else "every")
            + " trunk block recurrent",
        )
    groups, rank = h.u32("ssm.group_count"), h.u32("ssm.time_step_rank")
    if groups == 0 or rank == 0 or rank % groups:
        k = h.key("ssm.time_step_rank")
        yield problem("ssm-heads", k, f"{k} = {rank} is not a multiple of {h.key('ssm.group_count')} = {groups}")
    inner, state = h.u32("ssm.inner_size"), h.u32("ssm.state_size")
    if inner != state * rank:
        k = h.key("ssm.inner_size")
        yield problem("ssm-inner", k, f"{k} = {inner}, not {h.key('ssm.state_size')} x time_step_rank = {state * rank}")


def _swa_pattern(h: Header, missing: str, empty: str) -> Iterator[Problem]:
    """sliding_window_pattern: an array (a scalar reads as missing) marking at least one SWA block."""
    k = h.key("attention.sliding_window_pattern")
    pattern = h.ints("attention.sliding_window_pattern")
    if pattern is None:
        yield problem(missing, k, f"{k} is missing (an array)")
    elif not any(pattern):
        yield problem(empty, k, f"{k} marks no sliding-window block")


def _gemma4(h: Header) -> Iterator[Problem]:
    yield from _swa_pattern(h, "gemma4-swa", "gemma4-swa")
    for name in ("attention.sliding_window", "attention.key_length_swa", "attention.value_length_swa"):
        if not h.has(name):
            yield problem("gemma4-swa", h.key(name), f"{h.key(name)} is missing")
    swa_k, kr = h.u32("attention.key_length_swa"), h.key("rope.dimension_count_swa")
    n_rot_swa = h.u32("rope.dimension_count_swa", h.head_dims()[2])
    if swa_k and not (0 < n_rot_swa <= swa_k and n_rot_swa % 2 == 0):
        yield problem(
            "rope-dims", kr, f"{kr} = {n_rot_swa}, it must be even and 1 to the sliding-window head dimension {swa_k}"
        )
    shared = h.u32("attention.shared_kv_layers")
    if h.arch == "gemma4" and shared and h.n_layers - shared < 2:
        ks = h.key("attention.shared_kv_layers")
        yield problem(
            "gemma4-shared-kv", ks, f"{ks} = {shared} leaves fewer than 2 of {h.n_layers} blocks their own KV"
        )
    out = h.u32("embedding_length_out")
    if h.arch == "gemma4-assistant" and out in (0, h.n_embd):
        ko = h.key("embedding_length_out")
        yield problem("assistant-embd-out", ko, f"{ko} = {out}: it must name the target's width, not the assistant's")


def _deepseek2(h: Header) -> Iterator[Problem]:
    mla = h.u32("attention.key_length_mla") and h.u32("attention.value_length_mla")
    dk, _, n_rot = h.head_dims()
    kmla = h.u32("attention.key_length_mla") if mla else dk
    kr = h.key("rope.dimension_count")
    if kmla - n_rot < 1:
        yield problem("deepseek2-rope", kr, f"{kr} = {n_rot} leaves no room in the head dimension {kmla}")
    elif not (n_rot > 0 and n_rot % 2 == 0):
        yield problem("rope-dims", kr, f"{kr} = {n_rot}, it must be even and > 0")
    if h.f32("attention.temperature_scale") and not h.u32("attention.temperature_length"):
        k = h.key("attention.temperature_scale")
        yield problem("deepseek2-temperature", k, f"{k} is set without {h.key('attention.temperature_length')}")


def _swa(h: Header) -> Iterator[Problem]:
    yield from _swa_pattern(h, "required-key", "swa-pattern")
    if h.arch == "step35":
        dk, _, n_rot = h.head_dims()
        kr = h.key("rope.dimension_count")
        if n_rot // 2 == 0 or (n_rot // 2) % 2 or (dk and n_rot // 2 > dk):
            yield problem("step35-rope", kr, f"{kr} = {n_rot}: half of it must be even, > 0 and at most {dk}")
        # sliding-window blocks rotate rope.dimension_count_swa dims (default: the whole, unhalved count)
        ks, n_swa = h.key("rope.dimension_count_swa"), h.u32("rope.dimension_count_swa", n_rot)
        swa_dk = h.u32("attention.key_length_swa", dk)
        if any(h.ints("attention.sliding_window_pattern") or []) and not (0 < n_swa <= swa_dk and n_swa % 2 == 0):
            yield problem("step35-rope", ks, f"{ks} = {n_swa}: it must be even and 1 to the head dimension {swa_dk}")


@check
def head_block(h: Header) -> Iterator[Problem]:
    n, n_trunk = h.n_nextn, h.n_layers - h.n_nextn
    kn = h.key("nextn_predict_layers")
    if n > 1:  # (the rule holds for the archs whose record says one_head_block)
        yield problem("one-head-block", kn, f"{kn} = {n}; llama.cpp's {h.arch} MTP graph runs one head block")
    if is_(h.arch, "dense_lead") and n and h.u32("leading_dense_block_count") > n_trunk:
        k = h.key("leading_dense_block_count")
        yield problem(
            "head-block-moe", k, f"{k} = {h.u32('leading_dense_block_count')} reaches the head block ({n_trunk})"
        )
    for i in range(max(n_trunk, 0), h.n_layers if n else 0):
        for part in ("eh_proj", "enorm", "hnorm"):
            name = f"blk.{i}.nextn.{part}.weight"
            if name not in h.tensors:
                yield problem("head-tensors", name, f"head block {i} has no {name}")
                return
