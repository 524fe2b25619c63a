"""JSON schemas as grammars (mtp_cli.schemas): constraints that cannot hold and keywords a grammar
cannot enforce are refused naming the keyword and where; integer bounds, type lists with their
keywords, email/uri formats and a one-element allOf are honoured; pydantic's usual models convert."""

from __future__ import annotations

import datetime
import enum
import json
import re
import uuid
from typing import Literal, Optional

import pydantic
import pytest

from mtp_cli import llama_ext as lx
from mtp_cli.schema_ranges import int_range
from mtp_cli.schemas import SchemaError, grammar


def _regex(gbnf_alternatives: str) -> re.Pattern[str]:
    """int_range's GBNF read as a regex (it uses literals, classes, groups and counts only)."""
    return re.compile("^(?:" + gbnf_alternatives.replace('"', "").replace(" ", "") + ")$")


@pytest.mark.parametrize(
    "lo,hi",
    [
        (0, 9),
        (1, 100),
        (5, 5),
        (-5, 5),
        (-100, -7),
        (13, 987),
        (None, 3),
        (-3, None),
        (7, None),
        (None, -12),
        (0, None),
        (99, 1000),
        (100, 199),
        (-1, 0),
    ],
)
def test_an_integer_range_admits_exactly_its_integers_as_json_writes_them(lo, hi):
    r = _regex(int_range(lo, hi))
    for v in range(-1300, 1300):
        assert bool(r.match(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    assert not any(r.match(bad) for bad in ("01", "-0", "00", "-01", "+1", ""))


@pytest.mark.parametrize(
    "schema,where,keyword",
    [
        ({"type": "integer", "minimum": 10, "maximum": 5}, "", "minimum"),
        ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "", "exclusiveMinimum"),
        ({"type": "integer", "minimum": 1.2, "maximum": 1.7}, "", "minimum"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "", "minLength"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "", "minItems"),
        ({"enum": []}, "", "enum"),
        ({"const": "a", "enum": ["b"]}, "", "const"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "", "allOf"),
        ({"type": [], "maxLength": 1}, "", "type"),
        ({"type": "object", "required": ["x"], "additionalProperties": False}, "", "required"),
        (
            {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": []}}}},
            "properties.a.items",
            "enum",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Gone"}}}, "properties.a", "$ref"),
        ({"$ref": "http://example.com/s.json"}, "", "$ref"),
        ({"type": "strin"}, "", "type"),
    ],
)
def test_a_constraint_that_cannot_hold_is_refused_naming_its_keyword_and_place(schema, where, keyword):
    with pytest.raises(SchemaError) as e:
        grammar(schema)
    assert (e.value.where, e.value.keyword) == (where, keyword)
    said = str(e.value.under("response_format.json_schema.schema"))
    assert said.startswith(f"`response_format.json_schema.schema{'.' + where if where else ''}`: {keyword}: ")


@pytest.mark.parametrize(
    "schema,keyword",
    [
        ({"type": "number", "minimum": 0}, "minimum"),
        ({"type": "integer", "multipleOf": 2}, "multipleOf"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "minProperties": 1}, "minProperties"),
        ({"not": {"type": "null"}}, "not"),
        ({"if": {}, "then": {}}, "if"),
        ({"type": "array", "contains": {"const": 1}}, "contains"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
        ({"type": "string", "format": "ipv6"}, "format"),
        ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
        ({"type": "string", "format": "date", "pattern": "^a$"}, "pattern"),
        ({"allOf": [{"type": "string", "minLength": 1}, {"type": "string", "maxLength": 3}]}, "allOf"),
    ],
)
def test_a_keyword_the_grammar_cannot_enforce_is_refused_by_name(schema, keyword):
    with pytest.raises(SchemaError) as e:
        grammar(schema)
    assert e.value.keyword == keyword


def test_what_the_converter_drops_is_honoured():
    """Integer bounds, a type list's other keywords, email and uri, a one-element allOf: in the grammar."""
    g = grammar({"type": "integer", "minimum": 3, "maximum": 7})
    assert "[3-7]" in g and "integral-part" not in g
    assert "char (char (char)?)?" in grammar({"type": ["string", "null"], "maxLength": 3})
    assert "@" in grammar({"type": "string", "format": "email"})
    assert '":/" "/"' in grammar({"type": "string", "format": "uri"})
    one = {
        "allOf": [{"$ref": "#/$defs/A"}],
        "$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": 0}}}},
    }
    assert "[1-9]" in grammar(one)
    assert grammar({"type": "array", "uniqueItems": False}) == lx.json_schema_grammar({"type": "array"})
    # draft 4's boolean exclusiveMinimum: 0 excluded
    assert "[1-9]" in grammar({"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 9})


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(pydantic.BaseModel):
    street: str
    number: int = pydantic.Field(ge=1, le=9999)
    zip: Optional[str] = pydantic.Field(None, max_length=10)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(min_length=1, max_length=40)
    age: int = pydantic.Field(ge=0, lt=150)
    home: Address
    others: list[Address] = []
    colour: Colour
    kind: Literal["a", "b"]
    scores: dict[str, int]
    pair: tuple[int, str]
    born: datetime.date
    seen: datetime.datetime
    id: uuid.UUID
    ratio: float
    friend: Optional[Person] = None


def test_pydantics_usual_models_convert_and_sets_and_float_bounds_are_refused_by_name():
    g = grammar(Person.model_json_schema())
    assert "[1-9]" in g and "home" in g
    json.dumps(g)

    class Tags(pydantic.BaseModel):
        tags: set[str]
        share: float = pydantic.Field(gt=0)

    with pytest.raises(SchemaError, match="uniqueItems"):
        grammar(Tags.model_json_schema())


def test_a_reference_to_the_schemas_root_is_followed():
    """pydantic-ai writes a recursive output type as refs to "#": the converter follows "#/..." only."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["n"],
    }
    g = grammar(schema)
    assert "root-self" in g and "null" in g


def test_review_fixes_sizes_values_in_bounds_shapes_and_depth():
    """Found by review: a bound of 30 digits made a grammar of gigabytes (each digit doubled it); an
    integer enum or const with bounds became the whole range; allOf beside properties was dropped;
    a one-element allOf took the other type; `items: {}` / `true`, keywords of the wrong JSON type,
    deep nesting and a reference to itself alone were 500s or cryptic."""
    assert len(grammar({"type": "integer", "minimum": -(10**30), "maximum": 10**30})) < 5000
    assert "-7" not in grammar({"type": "integer", "enum": [1, 2, 100, -7], "minimum": 0, "maximum": 10})
    assert '"100"' not in grammar({"type": "integer", "enum": [1, 2, 100], "maximum": 10})
    for bad, keyword in (
        ({"type": "integer", "const": -5, "minimum": 0}, "const"),
        ({"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}, "required": ["b"]}]}, "allOf"),
        ({"type": "string", "allOf": [{"type": "integer"}]}, "allOf"),
        ({"allOf": [{"type": "object", "additionalProperties": False}, {"properties": {"b": {}}}]}, "allOf"),
        ({"properties": 5}, "properties"),
        ({"type": {}}, "type"),
        ({"type": "string", "format": {}}, "format"),
        ({"type": "integer", "minimum": True}, "minimum"),
        ({"required": [1]}, "required"),
        ({"$ref": "#"}, "$ref"),
    ):
        with pytest.raises(SchemaError) as e:
            grammar(bad)
        assert e.value.keyword == keyword, bad
    for anything in ({"type": "array", "items": {}}, {"type": "array", "items": True}, {"description": "any value"}):
        assert "null" in grammar(anything) and "boolean" in grammar(anything)
    deep: dict = {}
    inner = deep
    for _ in range(400):
        inner["items"] = {}
        inner = inner["items"]
    with pytest.raises(SchemaError, match="nested too deeply"):
        grammar({"type": "array", **deep})
