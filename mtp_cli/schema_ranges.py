"""Decimal integer ranges as GBNF (JSON's way of writing integers: no leading zeros, "-" for the
negatives): what a JSON schema's integer bounds become, since the converter ignores them."""

from __future__ import annotations

from typing import Optional


def int_range(lo: Optional[int], hi: Optional[int]) -> str:
    """GBNF for the decimal integers in [lo, hi] (None: unbounded), written as JSON writes them."""
    parts = []
    if lo is None or lo < 0:  # the negative part, as "-" and the magnitudes it takes
        top = None if lo is None else -lo
        bottom = 1 if hi is None or hi >= 0 else -hi
        parts.append(f'"-" ( {_naturals(bottom, top)} )')
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo or 0, 0), hi))
    return " | ".join(f"( {p} )" for p in parts)


def _naturals(lo: int, hi: Optional[int]) -> str:
    """GBNF for the integers in [lo, hi] (lo >= 0; hi None: unbounded) without leading zeros."""
    alts = []
    width = len(str(lo))
    while hi is None or lo <= hi:
        top = 10**width - 1
        alts += _same_width(str(lo), str(min(top, hi) if hi is not None else top))
        if hi is not None and hi <= top:
            break
        lo, width = top + 1, width + 1
        if hi is None:  # (every longer number: a first digit, then at least `width - 1` more)
            alts.append(f"[1-9] [0-9]{{{width - 1},}}")
            break
    return " | ".join(alts)


def _same_width(a: str, b: str) -> list[str]:
    """Alternatives for the numbers from a to b, both of one width (a <= b): linear in the width
    (a whole block, a0..b0 followed by any digits, is one class and a count)."""
    if a == b:
        return [" ".join(f'"{c}"' for c in a)]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    n = len(a) - 1
    if set(a[1:]) == {"0"} and set(b[1:]) == {"9"}:
        return [f"[{a[0]}-{b[0]}] [0-9]{{{n}}}"]
    if a[0] == b[0]:
        return [f'"{a[0]}" ( {" | ".join(_same_width(a[1:], b[1:]))} )']
    out = _same_width(a, a[0] + "9" * n)
    if int(a[0]) + 1 <= int(b[0]) - 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}] [0-9]{{{n}}}")
    return out + _same_width(b[0] + "0" * n, b)


__all__ = ["int_range"]
