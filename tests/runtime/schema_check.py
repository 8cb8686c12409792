"""Documents and their mutations for checking ``edgecap.runtime.schema`` against ``jsonschema`` (the reference
implementation): the two must accept and reject exactly the same documents."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Mapping
from typing import Any

from edgecap.runtime.schema import errors

#: What a value is replaced with: one value of every JSON type, an integer below every minimum, a string no
#: pattern or const of the schemas matches.
REPLACEMENTS: tuple[Any, ...] = (None, True, -1, 2.5, "x", [], {}, [1], {"k": 1})


def _paths(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _at(doc: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def mutations(doc: Any, limit: int = 1500, seed: int = 0) -> Iterator[Any]:
    """Copies of ``doc`` each with one change: a value replaced by each of :data:`REPLACEMENTS`, an object key
    removed, an unknown key added, an array emptied (a deterministic sample of ``limit`` of them)."""
    changes: list[tuple[tuple[str | int, ...], str, Any]] = []
    for path in _paths(doc):
        node = _at(doc, path)
        if path:
            changes += [(path, "set", v) for v in REPLACEMENTS]
        if isinstance(node, dict):
            changes += [((*path, key), "del", None) for key in node]
            changes.append(((*path, "unknown_field"), "set", 1))
        if isinstance(node, list) and node:
            changes.append((path, "set", []))
    random.Random(seed).shuffle(changes)
    for path, kind, value in changes[:limit]:
        out = copy.deepcopy(doc)
        parent = _at(out, path[:-1])
        if kind == "del":
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(value)
        yield out


def disagreements(docs: list[Any], schema: Mapping[str, Any]) -> list[tuple[bool, bool, Any]]:
    """``(ours, jsonschema's, document)`` for every document the two validators judge differently."""
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    reference = jsonschema.Draft202012Validator(schema)
    out = []
    for doc in docs:
        ours = next(iter(errors(doc, schema, schema)), None) is None
        theirs = reference.is_valid(doc)
        if ours != theirs:
            out.append((ours, theirs, doc))
    return out
