"""What a JSON schema must be before a grammar can follow it: keywords of the right JSON types,
constraints some value meets, references that lead somewhere, and none of the keywords a grammar
cannot enforce (REFUSED). Each failure is a SchemaError naming the keyword and where it sits."""

from __future__ import annotations

import math
from typing import Any, Optional

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
# keywords that shape a value (a schema with none of them admits any JSON value)
STRUCTURE = {
    "type", "enum", "const", "properties", "additionalProperties", "required", "items", "prefixItems",
    "anyOf", "oneOf", "allOf", "$ref", "pattern", "format", "minLength", "maxLength", "minItems", "maxItems",
}  # fmt: skip
# (keyword, the JSON types it takes, said)
SHAPES = (
    ("properties", dict, "an object of schemas"),
    ("$defs", dict, "an object of schemas"),
    ("definitions", dict, "an object of schemas"),
    ("required", list, "an array of property names"),
    ("items", (dict, list, bool), "a schema"),
    ("prefixItems", list, "an array of schemas"),
    ("additionalProperties", (dict, bool), "a schema or a boolean"),
    ("anyOf", list, "an array of schemas"),
    ("oneOf", list, "an array of schemas"),
    ("allOf", list, "an array of schemas"),
    ("type", (str, list), "a type name or a list of them"),
    ("format", str, "a string"),
    ("pattern", str, "a string"),
)
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


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


def check_shapes(node: dict[str, Any], at: str) -> None:
    """Keywords of the wrong JSON type are refused by name (the converter would fail on them)."""
    for key, kinds, said in SHAPES:
        if key in node and not isinstance(node[key], kinds):
            raise SchemaError(at, key, f"must be {said}, got {type(node[key]).__name__}")
    kind = node.get("type")
    if isinstance(kind, list) and not all(isinstance(k, str) for k in kind):
        raise SchemaError(at, "type", "must be a type name or a list of them")
    required = node.get("required", [])
    if not all(isinstance(r, str) for r in required):
        raise SchemaError(at, "required", "must list property names")
    for k in BOUNDS:
        exclusive = k.startswith("exclusive")
        if k in node and isinstance(node[k], bool) and not exclusive:
            raise SchemaError(at, k, f"must be a number, got {node[k]!r}")


def check_ref(ref: Any, at: str, root: dict[str, Any]) -> None:
    """A $ref must point inside the schema, at something there that is more than references."""
    seen = set()
    while isinstance(ref, str) and ref not in seen:
        seen.add(ref)
        target = _target(ref, at, root)
        ref = target.get("$ref") if isinstance(target, dict) and not STRUCTURE - {"$ref"} & set(target) else None
    if ref is not None:
        raise SchemaError(at, "$ref", f"{ref!r} refers only to references: no value can match")


def _target(ref: Any, at: str, root: dict[str, Any]) -> Any:
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
    return target


def check_counts(node: dict[str, Any], at: str) -> None:
    """Lower bounds above upper bounds: no value can match."""
    for lo, hi in (("minLength", "maxLength"), ("minItems", "maxItems")):
        for k in (lo, hi):
            if k in node and (not isinstance(node[k], int) or isinstance(node[k], bool) or node[k] < 0):
                raise SchemaError(at, k, f"must be a non-negative integer, got {node[k]!r}")
        if lo in node and hi in node and node[lo] > node[hi]:
            raise SchemaError(at, lo, f"{lo} {node[lo]} is above {hi} {node[hi]}: no value can match")
    lo_v, hi_v = bounds(node, at)
    if lo_v is not None and hi_v is not None and (lo_v[0] > hi_v[0] or (lo_v[0] == hi_v[0] and (lo_v[1] or hi_v[1]))):
        said = f"{lo_v[2]} {lo_v[0]} and {hi_v[2]} {hi_v[0]}"
        raise SchemaError(at, lo_v[2], f"{said}: no value can match")
    required, props = node.get("required"), node.get("properties", {})
    if node.get("additionalProperties") is False and isinstance(required, list):
        missing = [r for r in required if isinstance(r, str) and r not in props]
        if missing:
            raise SchemaError(at, "required", f"{missing[0]!r} is required but no property may have that name")


def bounds(
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


def check_enum(node: dict[str, Any], at: str) -> None:
    values = node["enum"]
    if not isinstance(values, list):
        raise SchemaError(at, "enum", "must be an array")
    if not values:
        raise SchemaError(at, "enum", "is empty: no value can match")
    if "const" in node and node["const"] not in values:
        raise SchemaError(at, "const", f"{node['const']!r} is not one of enum's values")


__all__ = [
    "SchemaError",
    "REFUSED",
    "STRUCTURE",
    "SHAPES",
    "BOUNDS",
    "bounds",
    "check_shapes",
    "check_ref",
    "check_counts",
    "check_enum",
]
