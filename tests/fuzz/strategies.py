"""Strategies shared by the fuzz tests: arbitrary JSON, path-like strings and mutations of a JSON document."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

#: Strings that try to leave a directory or confuse a path join.
NASTY_PATHS = [
    "../outside.json",
    "../../../../etc/passwd",
    "/etc/passwd",
    "/",
    "..",
    ".",
    "",
    "a/../../b",
    "sub/../../escape",
    "C:\\Windows\\win.ini",
    "\\\\server\\share",
    "nul\x00byte",
    "~/.ssh/id_rsa",
    "./config.json",
    "onnx/../../x",
    "vocab.json/",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(NASTY_PATHS),
)

json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path in ``doc`` (dict keys and list indices), the root included."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:6]):
            found += _paths(value, (*prefix, i))
    return found


@st.composite
def mutated_json(draw: st.DrawFn, base: Any, max_mutations: int = 3) -> Any:
    """``base`` with 1..max_mutations edits: a value replaced (by arbitrary JSON, a nasty path or a changed type),
    a key deleted, or a key added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_mutations))):
        path = draw(st.sampled_from(_paths(doc)))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "path"]))
        if not path:
            if op in ("replace", "path"):
                doc = draw(json_values)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        if op == "replace":
            parent[last] = draw(json_values)
        elif op == "path":
            parent[last] = draw(st.sampled_from(NASTY_PATHS))
        elif op == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.text(max_size=8))] = draw(json_values)
        elif isinstance(parent[last], list):
            parent[last].append(draw(json_values))
    return doc


def byte_mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` with byte flips, a truncation, or random bytes spliced in (header edits included)."""
    n = len(data)

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        out = bytearray(data)
        kind = draw(st.sampled_from(["flip", "truncate", "splice", "header"]))
        if kind == "flip":
            for _ in range(draw(st.integers(1, 8))):
                i = draw(st.integers(0, n - 1))
                out[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del out[draw(st.integers(0, n - 1)) :]
        elif kind == "splice":
            i = draw(st.integers(0, n))
            out[i:i] = draw(st.binary(min_size=1, max_size=64))
        else:  # overwrite bytes within the first 64 (headers, sizes, chunk lengths)
            i = draw(st.integers(0, min(63, n - 1)))
            patch = draw(st.binary(min_size=1, max_size=8))
            out[i : i + len(patch)] = patch
        return bytes(out)

    return mutate()
