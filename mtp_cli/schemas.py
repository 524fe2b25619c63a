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
from mtp_cli.errors import ConfigError

# keywords a GBNF grammar over the converter cannot enforce: refused, never silently dropped
REFUSED = {
    "multipleOf": "a grammar cannot check divisibility",
    "uniqueItems": "a grammar cannot compare an array's items",
    "minProperties": "property counts are not enforced",
    "maxProperties": "property counts are not enforced",
    "not": "a grammar cannot exclude a schema",
    "if": "conditional schemas are not supported",
    "then": "conditional schemas are not supported",
    "else": "conditional schemas are not supported",
    "contains": "a grammar cannot require an item anywhere in an array",
    "minContains": "a grammar cannot count matching items",
    "maxContains": "a grammar cannot count matching items",
    "patternProperties": "property names by pattern are not supported",
    "propertyNames": "property names by schema are not supported",
    "dependentRequired": "dependent properties are not supported",
    "dependentSchemas": "dependent schemas are not supported",
    "dependencies": "dependent properties are not supported",
    "unevaluatedProperties": "unevaluatedProperties is not supported (use additionalProperties)",
    "unevaluatedItems": "unevaluatedItems is not supported",
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "recursive references are supported as $ref only",
}
FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
# formats the converter ignores, honoured as patterns (characters JSON needs no escape for)
FORMAT_PATTERNS = {
    "email": r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$",
    "uri": r"^[a-z][a-z0-9+.-]*://[A-Za-z0-9._~:/?#@!$&()*+,;=%-]+$",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_INT_MARK = "mtp-int-range-"


class SchemaError(ConfigError):
    """A schema the grammar cannot follow: `where` (a dotted path inside it), the keyword, and why."""

    def __init__(self, where: str, keyword: str, why: str):
        self.where, self.keyword, self.why = where, keyword, why
        super().__init__(f"{keyword}{' at ' + where if where else ''}: {why}")

    def under(self, name: str, label: str = "") -> ConfigError:
        """The error as the request names the schema (`name`, e.g. response_format.json_schema.schema;
        `label` said after it, e.g. the tool's name)."""
        at = f"{name}.{self.where}" if self.where else name
        return ConfigError(f"`{at}`{label}: {self.keyword + ': ' if self.keyword else ''}{self.why}")


def grammar(schema: Any) -> str:
    """GBNF for the values `schema` admits; SchemaError naming what cannot be followed."""
    if not isinstance(schema, dict):
        raise SchemaError("", "schema", "must be a JSON object")
    if _refers_to_root(schema):  # (the converter follows "#/..." only: the whole schema moves under $defs)
        schema = {"$defs": {"root-self": moved(schema, "#/$defs/root-self")}, "$ref": "#/$defs/root-self"}
    ranges: list[str] = []
    done = _rewrite(copy.deepcopy(schema), "", ranges, schema)
    try:
        text = lx.json_schema_grammar(done)
    except (ValueError, RecursionError) as e:
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
        if isinstance(node.get(key), dict):
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
            return {}
        raise SchemaError(at, "false", "no value can match")
    if not isinstance(node, dict):
        raise SchemaError(at, "schema", "must be a JSON object")
    if "$ref" in node:
        _check_ref(node["$ref"], at, root)
    for key, why in REFUSED.items():
        if key in node and not (key == "uniqueItems" and node[key] is False):
            raise SchemaError(at, key, why)
    for path, box, key in _sub(node, at):
        box[key] = _rewrite(box[key], path, ranges, root)
    _check_counts(node, at)
    if isinstance(node.get("allOf"), list):
        node = _all_of(node, at, root)
    if "enum" in node:
        _check_enum(node, at)
    kind = node.get("type")
    if isinstance(kind, list):
        return _type_list(node, at, ranges, root)
    if kind is not None and kind not in TYPES:
        raise SchemaError(at, "type", f"unknown type {kind!r}")
    if kind == "integer" and any(k in node for k in BOUNDS):
        return _int_placeholder(node, at, ranges)
    if kind == "number" or (kind is None and any(k in node for k in BOUNDS)):
        for k in BOUNDS:
            if k in node:
                raise SchemaError(at, k, "bounds on a number cannot be enforced (on an integer they are)")
    if kind in (None, "string"):
        node = _string(node, at)
    return _ref_leaf(node)


def _ref_leaf(node: dict[str, Any]) -> dict[str, Any]:
    """A $ref beside subschemas ($defs at a root that is a $ref, as pydantic writes a recursive
    model) as a one-way anyOf: the converter does not look inside a node holding a $ref."""
    rest = {k: v for k, v in node.items() if k != "$ref"}
    if "$ref" not in node or "anyOf" in node or not any(isinstance(v, (dict, list)) for v in rest.values()):
        return node
    return {**rest, "anyOf": [{"$ref": node["$ref"]}]}


def _check_ref(ref: Any, at: str, root: dict[str, Any]) -> None:
    """A $ref must point inside the schema, at something there."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaError(at, "$ref", f"{ref!r}: only references inside the schema (#/...) are followed")
    target: Any = root
    for key in filter(None, ref[1:].split("/")):
        key = key.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and key in target:
            target = target[key]
        elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
            target = target[int(key)]
        else:
            raise SchemaError(at, "$ref", f"{ref!r} points to nothing in the schema")


def _check_counts(node: dict[str, Any], at: str) -> None:
    """Lower bounds above upper bounds: no value can match."""
    for lo, hi in (("minLength", "maxLength"), ("minItems", "maxItems")):
        for k in (lo, hi):
            if k in node and (not isinstance(node[k], int) or isinstance(node[k], bool) or node[k] < 0):
                raise SchemaError(at, k, f"must be a non-negative integer, got {node[k]!r}")
        if lo in node and hi in node and node[lo] > node[hi]:
            raise SchemaError(at, lo, f"{lo} {node[lo]} is above {hi} {node[hi]}: no value can match")
    lo_v, hi_v = _bounds(node, at)
    if lo_v is not None and hi_v is not None and (lo_v[0] > hi_v[0] or (lo_v[0] == hi_v[0] and (lo_v[1] or hi_v[1]))):
        said = f"{lo_v[2]} {lo_v[0]} and {hi_v[2]} {hi_v[0]}"
        raise SchemaError(at, lo_v[2], f"{said}: no value can match")
    required, props = node.get("required"), node.get("properties", {})
    if node.get("additionalProperties") is False and isinstance(required, list):
        missing = [r for r in required if isinstance(r, str) and r not in props]
        if missing:
            raise SchemaError(at, "required", f"{missing[0]!r} is required but no property may have that name")


def _bounds(
    node: dict[str, Any], at: str
) -> tuple[Optional[tuple[float, bool, str]], Optional[tuple[float, bool, str]]]:
    """((lower, exclusive, keyword) or None, (upper, exclusive, keyword) or None); draft 4's boolean
    exclusiveMinimum / exclusiveMaximum read as they were meant."""
    out: list[Optional[tuple[float, bool, str]]] = []
    for plain, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        for k in (plain, excl):
            v = node.get(k)
            if k in node and not isinstance(v, bool) and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise SchemaError(at, k, f"must be a number, got {v!r}")
        flag = node.get(excl)
        if isinstance(flag, bool):
            out.append((node[plain], flag, plain) if plain in node else None)
        elif excl in node and (
            plain not in node or (flag >= node[plain] if plain == "minimum" else flag <= node[plain])
        ):
            out.append((float(node[excl]), True, excl))
        else:
            out.append((node[plain], False, plain) if plain in node else None)
    return out[0], out[1]


def _check_enum(node: dict[str, Any], at: str) -> None:
    values = node["enum"]
    if not isinstance(values, list):
        raise SchemaError(at, "enum", "must be an array")
    if not values:
        raise SchemaError(at, "enum", "is empty: no value can match")
    if "const" in node and node["const"] not in values:
        raise SchemaError(at, "const", f"{node['const']!r} is not one of enum's values")


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
    if len(parts) == 1 and not {"properties", "additionalProperties"} & set(rest):
        return {**rest, **parts[0]} if "$ref" not in parts[0] else {**rest, "$ref": parts[0]["$ref"]}
    kinds = {_kind(p, root) for p in parts} | ({rest["type"]} if isinstance(rest.get("type"), str) else set())
    if len(kinds - {None}) > 1:
        raise SchemaError(at, "allOf", f"of {' and '.join(sorted(k for k in kinds if k))}: no value can match")
    if kinds - {None} != {"object"}:
        raise SchemaError(at, "allOf", "is honoured for objects only (merge the other schemas into one)")
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
    lo_b, hi_b = _bounds(node, at)
    lo = None if lo_b is None else (math.floor(lo_b[0]) + 1 if lo_b[1] else math.ceil(lo_b[0]))
    hi = None if hi_b is None else (math.ceil(hi_b[0]) - 1 if hi_b[1] else math.floor(hi_b[0]))
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(
            at, lo_b[2] if lo_b else "minimum", f"no integer lies between {lo_b and lo_b[0]} and {hi_b and hi_b[0]}"
        )
    ranges.append(int_range(lo, hi))
    rest = {k: v for k, v in node.items() if k not in (*BOUNDS, "type")}
    return {**rest, "const": f"{_INT_MARK}{len(ranges) - 1}"}


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
    """Alternatives for the numbers from a to b, both of one width (a <= b)."""
    if a == b:
        return [" ".join(f'"{c}"' for c in a)]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [f'"{a[0]}" ( {" | ".join(_same_width(a[1:], b[1:]))} )']
    n = len(a) - 1
    out = _same_width(a, a[0] + "9" * n)
    if int(a[0]) + 1 <= int(b[0]) - 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}] [0-9]{{{n}}}")
    return out + _same_width(b[0] + "0" * n, b)


def checked(schema: Any, name: str) -> str:
    """grammar(schema), its errors spelled as the request names the schema (ConfigError)."""
    try:
        return grammar(schema)
    except SchemaError as e:
        raise e.under(name) from None


__all__ = ["SchemaError", "grammar", "checked", "int_range", "moved", "REFUSED"]
