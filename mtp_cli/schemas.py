"""JSON schemas as grammars, checked first: a constraint that cannot hold (minimum above maximum, an
empty enum, allOf of a string and an integer) and a keyword the grammar cannot express are a
SchemaError naming the keyword and where it sits; what the converter (llama-cpp-python's port of
llama.cpp's) leaves out but a grammar can say is rewritten before it sees the schema: integer
bounds become digit ranges, a list of types keeps its keywords, email and uri formats become
patterns, a one-element allOf is its element.

What each keyword gets (the README's table says the same):
  honoured   type, enum, const, properties, required, additionalProperties, items, prefixItems,
             minItems, maxItems, minLength, maxLength, pattern, format (date, time, date-time,
             uuid, email, uri), $ref / $defs / definitions, anyOf, oneOf, allOf of objects,
             minimum / maximum / exclusiveMinimum / exclusiveMaximum on integers
  ignored    annotations that constrain nothing: title, description, default, examples, ...
  refused    everything in REFUSED, bounds on numbers, other formats, a pattern or format beside
             a length, allOf of anything but objects
"""

from __future__ import annotations

import copy
import math
from typing import Any, Optional

from mtp_cli import llama_ext as lx
from mtp_cli.schema_checks import (
    BOUNDS,
    REFUSED,
    STRUCTURE,
    SchemaError,
    bounds,
    check_counts,
    check_enum,
    check_ref,
    check_shapes,
)
from mtp_cli.schema_ranges import int_range

FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
# formats the converter ignores, honoured as patterns (characters JSON needs no escape for)
FORMAT_PATTERNS = {
    "email": r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$",
    "uri": r"^[a-z][a-z0-9+.-]*://[A-Za-z0-9._~:/?#@!$&()*+,;=%-]+$",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
ANY = {"anyOf": [{"type": t} for t in ("object", "array", "string", "number", "boolean", "null")]}
_INT_MARK = "mtp-int-range-"


def grammar(schema: Any) -> str:
    """GBNF for the values `schema` admits; SchemaError naming what cannot be followed."""
    if not isinstance(schema, dict):
        raise SchemaError("", "schema", "must be a JSON object")
    ranges: list[str] = []
    try:
        if _refers_to_root(schema):  # (the converter follows "#/..." only: the whole schema moves under $defs)
            schema = {"$defs": {"root-self": moved(schema, "#/$defs/root-self")}, "$ref": "#/$defs/root-self"}
        done = _rewrite(copy.deepcopy(schema), "", ranges, schema)
        text = lx.json_schema_grammar(done)
    except SchemaError:
        raise
    except RecursionError:
        raise SchemaError("", "schema", "nested too deeply") from None
    except ValueError as e:
        raise SchemaError("", "", str(e)) from None
    for i, rule in enumerate(ranges):  # (each placeholder constant becomes its digit range)
        text = text.replace(f'"\\"{_INT_MARK}{i}\\""', f"( {rule} )")
    return text


def moved(x: Any, at: str) -> Any:
    """A schema's local $refs ("#", "#/$defs/A", any pointer) made to point at where the schema now
    sits, `at` (a pointer from the root of the schema it is embedded in)."""
    if isinstance(x, dict):
        return {
            k: at + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else moved(v, at)
            for k, v in x.items()
        }
    if isinstance(x, list):
        return [moved(v, at) for v in x]
    return x


def _refers_to_root(x: Any) -> bool:
    if isinstance(x, dict):
        return x.get("$ref") == "#" or any(_refers_to_root(v) for v in x.values())
    return isinstance(x, list) and any(_refers_to_root(v) for v in x)


def _sub(node: dict[str, Any], at: str) -> list[tuple[str, Any, Any]]:
    """(path, container, key) of each schema directly inside `node`."""
    out: list[tuple[str, Any, Any]] = []
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            out += [(_join(at, key, k), node[key], k) for k in node[key]]
    for key in ("additionalProperties", "items"):
        if isinstance(node.get(key), dict) or (key == "items" and isinstance(node.get(key), bool)):
            out.append((_join(at, key), node, key))
    for key in ("items", "prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), list):
            out += [(_join(at, key, str(i)), node[key], i) for i in range(len(node[key]))]
    return out


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _rewrite(node: Any, at: str, ranges: list[str], root: dict[str, Any]) -> Any:
    """`node` checked and rewritten in place (see the module docstring); returned."""
    if isinstance(node, bool):
        if node:
            return dict(ANY)
        raise SchemaError(at, "false", "no value can match")
    if not isinstance(node, dict):
        raise SchemaError(at, "schema", "must be a JSON object")
    check_shapes(node, at)
    if "$ref" in node:
        check_ref(node["$ref"], at, root)
    for key, why in REFUSED.items():
        if key in node and not (key == "uniqueItems" and node[key] is False):
            raise SchemaError(at, key, why)
    for path, box, key in _sub(node, at):
        box[key] = _rewrite(box[key], path, ranges, root)
    check_counts(node, at)
    if isinstance(node.get("allOf"), list):
        node = _all_of(node, at, root)
    if "enum" in node:
        check_enum(node, at)
    kind = node.get("type")
    if isinstance(kind, list):
        return _type_list(node, at, ranges, root)
    if kind is not None and kind not in TYPES:
        raise SchemaError(at, "type", f"unknown type {kind!r}")
    if kind == "integer" and any(k in node for k in BOUNDS):
        if "enum" in node or "const" in node:  # (the values themselves, those in bounds)
            return _values_in_bounds(node, at)
        return _int_placeholder(node, at, ranges)
    if kind == "number" or (kind is None and any(k in node for k in BOUNDS)):
        for k in BOUNDS:
            if k in node:
                raise SchemaError(at, k, "bounds on a number cannot be enforced (on an integer they are)")
    if kind in (None, "string"):
        node = _string(node, at)
    if not STRUCTURE & set(node):  # (nothing but annotations: any JSON value, which the converter lacks)
        return {**{k: node[k] for k in ("$defs", "definitions") if k in node}, **ANY}
    return _ref_leaf(node)


def _values_in_bounds(node: dict[str, Any], at: str) -> dict[str, Any]:
    """An integer enum or const with bounds: the values the bounds admit (none: refused)."""
    values = node["enum"] if "enum" in node else [node["const"]]
    lo, hi = bounds(node, at)

    def fits(v: Any) -> bool:
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        return (lo is None or v > lo[0] or (v == lo[0] and not lo[1])) and (
            hi is None or v < hi[0] or (v == hi[0] and not hi[1])
        )

    kept = [v for v in values if fits(v)]
    if not kept:
        raise SchemaError(at, "enum" if "enum" in node else "const", "no value lies within the bounds")
    rest = {k: v for k, v in node.items() if k not in (*BOUNDS, "const", "enum", "type")}
    return {**rest, "enum": kept}


def _ref_leaf(node: dict[str, Any]) -> dict[str, Any]:
    """A $ref beside subschemas ($defs at a root that is a $ref, as pydantic writes a recursive
    model) as a one-way anyOf: the converter does not look inside a node holding a $ref."""
    rest = {k: v for k, v in node.items() if k != "$ref"}
    if "$ref" not in node or "anyOf" in node or not any(isinstance(v, (dict, list)) for v in rest.values()):
        return node
    return {**rest, "anyOf": [{"$ref": node["$ref"]}]}


def _type_list(node: dict[str, Any], at: str, ranges: list[str], root: dict[str, Any]) -> dict[str, Any]:
    """{"type": [a, b], ...} as anyOf of the node with each type (the converter drops the rest)."""
    kinds = node["type"]
    if not kinds:
        raise SchemaError(at, "type", "an empty list of types: no value can match")
    rest = {k: v for k, v in node.items() if k not in ("type", "$defs", "definitions")}
    alts = [_rewrite({**copy.deepcopy(rest), "type": k}, at, ranges, root) for k in kinds]
    return {**{k: node[k] for k in ("$defs", "definitions") if k in node}, "anyOf": alts}


def _all_of(node: dict[str, Any], at: str, root: dict[str, Any]) -> dict[str, Any]:
    """allOf of one schema is that schema; of several, honoured for objects only (merged)."""
    parts = node["allOf"]
    if not parts:
        raise SchemaError(at, "allOf", "must not be empty")
    rest = {k: v for k, v in node.items() if k != "allOf"}
    kinds = {_kind(p, root) for p in parts} | ({rest["type"]} if isinstance(rest.get("type"), str) else set())
    if len(kinds - {None}) > 1:
        raise SchemaError(at, "allOf", f"of {' and '.join(sorted(k for k in kinds if k))}: no value can match")
    if len(parts) == 1 and not {"properties", "additionalProperties"} & set(rest):
        return {**rest, **parts[0]} if "$ref" not in parts[0] else {**rest, "$ref": parts[0]["$ref"]}
    if kinds - {None} != {"object"}:
        raise SchemaError(at, "allOf", "is honoured for objects only (merge the other schemas into one)")
    if {"properties", "additionalProperties"} & set(rest):
        raise SchemaError(at, "allOf", "beside properties: put them in one of its schemas (they are merged)")
    if any(isinstance(p, dict) and p.get("additionalProperties") is False for p in parts):
        raise SchemaError(at, "allOf", "with additionalProperties false in a part: the parts' properties are merged")
    return node


def _kind(part: Any, root: dict[str, Any]) -> Optional[str]:
    """The type a subschema of allOf admits (following one local $ref; None: any)."""
    if isinstance(part, dict) and isinstance(part.get("$ref"), str) and part["$ref"].startswith("#/"):
        target: Any = root
        for key in part["$ref"][2:].split("/"):
            target = target.get(key, {}) if isinstance(target, dict) else {}
        part = target
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind is None and ("properties" in part or "required" in part):
        return "object"
    return kind if isinstance(kind, str) else None


def _string(node: dict[str, Any], at: str) -> dict[str, Any]:
    """Formats: honoured, rewritten as a pattern, or refused; a pattern or format beside a length refused."""
    fmt = node.get("format")
    if fmt is not None and fmt not in FORMATS and fmt not in FORMAT_PATTERNS:
        raise SchemaError(
            at, "format", f"{fmt!r} cannot be enforced (honoured: {', '.join(sorted(FORMATS | set(FORMAT_PATTERNS)))})"
        )
    if fmt is not None and "pattern" in node:
        raise SchemaError(at, "pattern", f"beside format {fmt!r}: one of them would be dropped")
    shaped = "pattern" if "pattern" in node else f"format {fmt!r}" if fmt else None
    for k in ("minLength", "maxLength"):
        if shaped and k in node:
            raise SchemaError(at, k, f"beside {shaped}: a grammar follows one of them (put the length in the pattern)")
    if fmt in FORMAT_PATTERNS:
        node = {**{k: v for k, v in node.items() if k != "format"}, "pattern": FORMAT_PATTERNS[fmt]}
    return node


def _int_placeholder(node: dict[str, Any], at: str, ranges: list[str]) -> dict[str, Any]:
    """An integer with bounds: a constant the grammar's text swaps for the digit range."""
    lo_b, hi_b = bounds(node, at)
    lo = None if lo_b is None else (math.floor(lo_b[0]) + 1 if lo_b[1] else math.ceil(lo_b[0]))
    hi = None if hi_b is None else (math.ceil(hi_b[0]) - 1 if hi_b[1] else math.floor(hi_b[0]))
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(
            at, lo_b[2] if lo_b else "minimum", f"no integer lies between {lo_b and lo_b[0]} and {hi_b and hi_b[0]}"
        )
    ranges.append(int_range(lo, hi))
    rest = {k: v for k, v in node.items() if k not in (*BOUNDS, "type")}
    return {**rest, "const": f"{_INT_MARK}{len(ranges) - 1}"}


def checked(schema: Any, name: str) -> str:
    """grammar(schema), its errors spelled as the request names the schema (ConfigError)."""
    try:
        return grammar(schema)
    except SchemaError as e:
        raise e.under(name) from None


__all__ = ["SchemaError", "grammar", "checked", "moved", "REFUSED"]
