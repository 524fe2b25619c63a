"""A prescanned header as the checks read it: keys by their llama.cpp names, llama.cpp's defaults,
and the registry of checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gguf import GGUFValueType

from gguf_tools.limits import RULE, Rule
from gguf_tools.prescan import SCALAR_FORMATS, ArrayValue, Prescan, TensorEntry

_VERB = {
    "refuses": "refuses it",
    "aborts": "aborts",
    "SIGFPE": "divides by zero",
    "hangs": "hangs",
    "crashes": "crashes",
}


@dataclass(frozen=True)
class Problem:
    rule: Rule
    key: str  # the key (or tensor) at fault
    what: str  # one clause: the value and the limit

    def line(self) -> str:
        return f"not loadable by llama.cpp: {self.what} (llama.cpp {_VERB[self.rule.outcome]}: {self.rule.source})"


Check = Callable[["Header"], Iterator[Problem]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def problem(rule_id: str, key: str, what: str) -> Problem:
    return Problem(RULE[rule_id], key, what)


class Header:
    """Typed access to a prescan. Values that have the wrong type read as absent here: the key-type
    check reports them."""

    def __init__(self, scan: Prescan):
        self.scan = scan
        self.values, self.types = scan.values, scan.types
        arch = self.values.get("general.architecture", "")
        self.arch: str = arch if isinstance(arch, str) else ""
        self.tensors: dict[str, TensorEntry] = {t.name: t for t in scan.tensors}

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.values

    def scalar(self, name: str, vtype: GGUFValueType, default: Any = None) -> Any:
        """`{arch}.name` if stored as `vtype`, else `default`."""
        k = self.key(name)
        return self.values[k] if self.types.get(k) == vtype else default

    def u32(self, name: str, default: int = 0) -> int:
        return self.scalar(name, GGUFValueType.UINT32, default)

    def f32(self, name: str, default: float = 0.0) -> float:
        return self.scalar(name, GGUFValueType.FLOAT32, default)

    def ints(self, name: str) -> list[int] | None:
        """An integer array key's items, or None."""
        v = self.values.get(self.key(name))
        if isinstance(v, ArrayValue) and v.etype in _INT_TYPES:
            return [int(x) for x in v.items]  # type: ignore[arg-type]
        return None

    def per_layer(self, name: str, default: int = 0) -> list[int]:
        """A per-layer count as llama.cpp reads it (get_key_or_arr): an array, or a scalar for every layer."""
        arr = self.ints(name)
        if arr is not None:
            return arr
        return [self.u32(name, default)] * max(self.n_layers, 1)

    def kv_heads(self) -> list[int]:
        """head_count_kv per layer as llama.cpp reads it: absent, a copy of head_count
        (src/llama-model.cpp:1402-1404)."""
        return self.per_layer(
            "attention.head_count_kv" if self.has("attention.head_count_kv") else "attention.head_count"
        )

    @property
    def n_layers(self) -> int:
        return self.u32("block_count")

    @property
    def n_nextn(self) -> int:
        return self.u32("nextn_predict_layers")

    @property
    def n_embd(self) -> int:
        return self.u32("embedding_length")

    def head_dims(self) -> tuple[int, int, int]:
        """(key_length, value_length, rope dims) with llama.cpp's defaults (src/llama-model.cpp:1435-1459)."""
        n_head = self.per_layer("attention.head_count")[0]
        default = self.n_embd // n_head if n_head > 0 else 0
        dk = self.u32("attention.key_length", default)
        return dk, self.u32("attention.value_length", default), self.u32("rope.dimension_count", dk)

    def tokens(self) -> ArrayValue | None:
        v = self.values.get("tokenizer.ggml.tokens")
        return v if isinstance(v, ArrayValue) and v.etype == GGUFValueType.STRING else None


_INT_TYPES = {t for t, code in SCALAR_FORMATS.items() if code not in "fd"}  # (bool counts: llama.cpp reads it)
