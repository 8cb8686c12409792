"""A small JSON Schema validator: the subset the file formats' schemas use (``manifest.schema.json``,
``report.schema.json``), so reading a file checks it against the same schema its documentation is generated from,
without installing ``jsonschema`` on an edge board.

Keywords: ``type``, ``properties``, ``required``, ``additionalProperties``, ``items``, ``minItems``, ``maxItems``,
``enum``, ``const``, ``minimum``, ``maximum``, ``pattern``, ``$ref`` (to ``#/$defs/<name>``) and ``anyOf``;
``title``, ``description`` and the other annotations are ignored. A schema using any other keyword is refused when
it is loaded, so a schema never silently means less here than in ``jsonschema`` (the tests compare the two).
``integer`` is a JSON number written without a fraction (Python ``int``, never ``bool``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SchemaError", "check", "errors", "json_path", "load_schema"]

#: Keywords that constrain a value (checked here) and annotations (documentation only, ignored).
KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const"}
    | {"minimum", "maximum", "pattern", "$ref", "anyOf"}
)
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "examples", "default"})

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SchemaError(ValueError):
    """A schema file this validator cannot use: not JSON, an unknown keyword, or a ``$ref`` to nothing."""


def json_path(parts: tuple[str | int, ...]) -> str:
    """``$.results[1].latency``: object keys as ``.key`` (``['a/b']`` when not an identifier), indices as ``[i]``."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENTIFIER.match(part):
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def _walk(schema: Any, where: str, defs: Mapping[str, Any]) -> None:
    """Refuse keywords outside :data:`KEYWORDS` and :data:`ANNOTATIONS`, and dangling ``$ref``s."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a schema must be an object or a boolean, got {type(schema).__name__}")
    unknown = sorted(set(schema) - KEYWORDS - ANNOTATIONS)
    if unknown:
        raise SchemaError(f"{where}: keyword(s) {unknown} are not supported by edgecap.runtime.schema")
    ref = schema.get("$ref")
    if ref is not None and (not ref.startswith("#/$defs/") or ref.removeprefix("#/$defs/") not in defs):
        raise SchemaError(f"{where}: $ref {ref!r} is not one of the schema's $defs")
    for key in ("properties", "$defs"):
        for name, sub in schema.get(key, {}).items():
            _walk(sub, f"{where}/{key}/{name}", defs)
    for key in ("items", "additionalProperties"):
        if key in schema:
            _walk(schema[key], f"{where}/{key}", defs)
    for i, sub in enumerate(schema.get("anyOf", ())):
        _walk(sub, f"{where}/anyOf/{i}", defs)


@functools.cache
def load_schema(path: str) -> Mapping[str, Any]:
    """The schema in the JSON file ``path``, checked to use only the keywords this module implements (read once)."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaError(f"{path}: cannot read the schema: {exc}") from exc
    _walk(schema, path, schema.get("$defs", {}) if isinstance(schema, dict) else {})
    return schema


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is_type(value: Any, name: str) -> bool:
    actual = _type_name(value)
    return actual == name or (name == "number" and actual == "integer")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


Error = tuple[tuple[str | int, ...], str]


def errors(value: Any, schema: Any, root: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> Iterator[Error]:
    """Every ``(path, message)`` where ``value`` breaks ``schema`` (``root`` resolves ``$ref``), in document order;
    a value of the wrong type yields only that error, not its contents'."""
    if schema is True:
        return
    if schema is False:
        yield path, "no value is allowed here"
        return
    if "$ref" in schema:
        yield from errors(value, root["$defs"][schema["$ref"].removeprefix("#/$defs/")], root, path)
    if "anyOf" in schema:
        yield from _any_of(value, schema["anyOf"], root, path)
    if "type" in schema:
        names = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
        if not any(_is_type(value, n) for n in names):
            yield path, f"expected {' or '.join(names)}, got {_type_name(value)} {_short(value)}"
            return
    if "const" in schema and (value != schema["const"] or _type_name(value) != _type_name(schema["const"])):
        yield path, f"is {_short(value)}, expected {schema['const']!r}"
    if "enum" in schema and not any(value == e and _type_name(value) == _type_name(e) for e in schema["enum"]):
        yield path, f"{_short(value)} is not one of {schema['enum']}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield path, f"{value} is below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield path, f"{value} is above the maximum {schema['maximum']}"
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        yield path, f"{_short(value)} does not match {schema['pattern']!r}"
    if isinstance(value, list):
        yield from _array(value, schema, root, path)
    if isinstance(value, dict):
        yield from _object(value, schema, root, path)


def _array(value: list[Any], schema: Mapping[str, Any], root: Mapping[str, Any], path: tuple) -> Iterator[Error]:
    if "minItems" in schema and len(value) < schema["minItems"]:
        yield path, f"has {len(value)} item(s), at least {schema['minItems']} expected"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        yield path, f"has {len(value)} item(s), at most {schema['maxItems']} expected"
    if "items" in schema:
        for i, item in enumerate(value):
            yield from errors(item, schema["items"], root, (*path, i))


def _object(value: dict[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any], path: tuple) -> Iterator[Error]:
    for key in schema.get("required", ()):
        if key not in value:
            yield path, f"field {key!r} is missing"
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            yield from errors(item, properties[key], root, (*path, key))
        elif extra is False:
            yield path, f"unknown field {key!r} (known: {', '.join(properties)})"
        else:
            yield from errors(item, extra, root, (*path, key))


def _any_of(value: Any, options: list[Any], root: Mapping[str, Any], path: tuple) -> Iterator[Error]:
    """Nothing when one option matches; else the errors of the option that got furthest into ``value`` (the one
    of the right type), or one error listing what each option expected."""
    found = [list(errors(value, option, root, path)) for option in options]
    if any(not e for e in found):
        return
    deepest = max(found, key=lambda e: (len(e[0][0]), not e[0][1].startswith("expected ")))
    if len(deepest[0][0]) > len(path) or not deepest[0][1].startswith("expected "):
        yield from deepest
        return
    expected = " or ".join(e[0][1].removeprefix("expected ").split(", got")[0] for e in found)
    yield path, f"expected {expected}, got {_type_name(value)} {_short(value)}"


def check(value: Any, schema: Mapping[str, Any], where: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``where`` (the file), the JSON path and the first way ``value`` breaks ``schema``."""
    for path, message in errors(value, schema, schema):
        raise error(f"{where}: {json_path(path)}: {message}")
