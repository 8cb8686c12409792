"""``edgecap.runtime.schema``: each keyword it implements, the JSON path and file in its errors, and the refusal of
schemas that use keywords it does not implement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap.runtime.schema import SchemaError, check, errors, json_path, load_schema

from .schema_check import disagreements, mutations

SCHEMA = {
    "type": "object",
    "required": ["name", "items"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$"},
        "kind": {"enum": ["a", "b"]},
        "format": {"const": "fmt"},
        "count": {"type": "integer", "minimum": 1, "maximum": 3},
        "ratio": {"type": ["number", "null"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
        "pair": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
        "by_name": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "child": {"anyOf": [{"$ref": "#/$defs/item"}, {"type": "null"}]},
    },
    "$defs": {"item": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}},
}
VALID = {
    "name": "abc",
    "kind": "a",
    "format": "fmt",
    "count": 2,
    "ratio": 0.5,
    "items": [{"id": 1}, {"id": 2, "more": "ok"}],
    "pair": [1, 2.5],
    "by_name": {"x/y": True},
    "child": {"id": 3},
}


def _first(value: object) -> str:
    found = [f"{json_path(path)}: {message}" for path, message in errors(value, SCHEMA, SCHEMA)]
    return found[0] if found else ""


def test_a_valid_document_has_no_errors() -> None:
    assert _first(VALID) == ""
    assert _first({**VALID, "ratio": None, "child": None, "count": 1}) == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": 3}, "$.name: expected string, got integer 3"),
        ({"name": "ABC"}, "$.name: 'ABC' does not match '^[a-z]+$'"),
        ({"kind": "c"}, "$.kind: 'c' is not one of ['a', 'b']"),
        ({"format": "other"}, "$.format: is 'other', expected 'fmt'"),
        ({"count": 0}, "$.count: 0 is below the minimum 1"),
        ({"count": 4}, "$.count: 4 is above the maximum 3"),
        ({"count": True}, "$.count: expected integer, got boolean True"),
        ({"count": 2.0}, "$.count: expected integer, got number 2.0"),
        ({"ratio": "1"}, "$.ratio: expected number or null, got string '1'"),
        ({"items": [{"id": 1}, {"id": "2"}]}, "$.items[1].id: expected integer, got string '2'"),
        ({"items": [{}]}, "$.items[0]: field 'id' is missing"),
        ({"pair": [1]}, "$.pair: has 1 item(s), at least 2 expected"),
        ({"pair": [1, 2, 3]}, "$.pair: has 3 item(s), at most 2 expected"),
        ({"by_name": {"x/y": 1}}, "$.by_name['x/y']: expected boolean, got integer 1"),
        ({"child": {"id": "3"}}, "$.child.id: expected integer, got string '3'"),
        ({"child": 3}, "$.child: expected object or null, got integer 3"),
        ({"extra": 1}, "$: unknown field 'extra'"),
    ],
)
def test_each_keyword_names_the_json_path(change: dict, message: str) -> None:
    got = _first({**VALID, **change})
    assert got.startswith(message), got


def test_a_missing_field_is_named() -> None:
    data = dict(VALID)
    del data["items"]
    assert _first(data) == "$: field 'items' is missing"


def test_check_names_the_file_and_raises_the_callers_error() -> None:
    class FileError(ValueError):
        pass

    with pytest.raises(FileError, match=r"^dir/file\.json: \$\.items\[0\]\.id: expected integer"):
        check({**VALID, "items": [{"id": None}]}, SCHEMA, "dir/file.json", FileError)
    check(VALID, SCHEMA, "dir/file.json", FileError)


def test_schemas_with_unsupported_keywords_or_dangling_refs_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}}))
    with pytest.raises(SchemaError, match=r"\['format'\] are not supported"):
        load_schema(str(path))
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"properties": {"a": {"$ref": "#/$defs/missing"}}}))
    with pytest.raises(SchemaError, match="is not one of the schema's"):
        load_schema(str(path))


def test_it_agrees_with_jsonschema_on_every_mutation() -> None:
    docs = [VALID, *mutations(VALID, limit=5000)]
    assert len(docs) > 100
    assert disagreements(docs, SCHEMA) == []
