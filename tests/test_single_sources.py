"""Each extension point has one list: the package source holds no second list of precisions or runtimes, no private
onnxruntime API, and no pointer to notes outside the repository.

The checks read the source with ``ast`` (literals, attributes) or as text (references), so they see what a
``git grep`` would, but not strings that merely mention a name in a message.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgecap.runtime.backends.registry import _ALIASES, list_runtimes
from edgecap.runtime.precisions import FLOAT_PRECISIONS, PRECISIONS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgecap"
#: Where the lists live: the precisions, and the runtime registry with the built-in registrations.
PRECISIONS_HOME = PACKAGE / "runtime" / "precisions.py"
RUNTIMES_HOME = {PACKAGE / "runtime" / "backends" / "registry.py", PACKAGE / "runtime" / "backends" / "__init__.py"}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _literal_strings(node: ast.AST) -> list[str] | None:
    """The string elements of a tuple/list/set literal (None for anything else)."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _collections(path: Path) -> Iterator[tuple[int, list[str]]]:
    return _collections_of(ast.parse(path.read_text(), filename=str(path)))


def _collections_of(tree: ast.AST) -> Iterator[tuple[int, list[str]]]:
    for node in ast.walk(tree):
        strings = _literal_strings(node)
        if strings is None and isinstance(node, ast.Dict) and all(isinstance(v, ast.Constant) for v in node.values):
            # a dict of names to constants (an order, labels) is a list of them too; per-name data (tolerances) is not
            strings = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        if strings:
            yield node.lineno, strings


def is_precision_list(strings: list[str]) -> bool:
    """Every precision, or both float precisions: a re-listing of :data:`PRECISIONS`/:data:`FLOAT_PRECISIONS`.
    A preference among some of them (``("int8", "fp16")``) or per-precision values are data, not a list."""
    return set(PRECISIONS) <= set(strings) or (set(FLOAT_PRECISIONS) == set(strings) and len(strings) >= 2)


def is_runtime_list(strings: list[str], names: set[str]) -> bool:
    """Two or more runtime names and nothing else (package-name lists such as ``("torch", "onnx", ...)`` hold
    other names too)."""
    return len(set(strings) & names) >= 2 and set(strings) <= names


RUNTIME_NAMES = set(list_runtimes()) | set(_ALIASES)


def test_the_detectors_catch_the_lists_they_are_for() -> None:
    """The old code's second lists, and legitimate neighbours that must pass."""
    assert is_precision_list(["fp32", "fp16", "int8"]) and is_precision_list(["fp32", "fp16"])
    assert not is_precision_list(["int8", "fp16"]) and not is_precision_list(["fp32"])
    assert is_runtime_list(["torch", "torch-rerun", "ort"], RUNTIME_NAMES)
    assert not is_runtime_list(["torch", "onnxruntime", "onnx", "numpy"], RUNTIME_NAMES)  # package versions
    old = (
        'RUNTIMES = ("ort", "torch")\nPRECISIONS = ("fp32", "fp16")\nx = session._sess.run\n'
        'order = {"torch-rerun": 0, "torch": 1, "ort": 2}\ntol = {"fp32": Tolerance(1e-4), "fp16": Tolerance(1e-2)}\n'
    )
    tree = ast.parse(old)
    found = [strings for _, strings in sorted(_collections_of(tree))]
    assert len(found) == 3  # the tolerances: per-precision data, not a list
    assert [is_runtime_list(s, RUNTIME_NAMES) for s in found] == [True, False, True]
    assert [is_precision_list(s) for s in found] == [False, True, False]
    assert any(isinstance(n, ast.Attribute) and n.attr == "_sess" for n in ast.walk(tree))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_second_list_of_precisions_or_runtimes(path: Path) -> None:
    for line, strings in _collections(path):
        assert path == PRECISIONS_HOME or not is_precision_list(strings), (
            f"{path.relative_to(ROOT)}:{line}: {strings} re-lists the precisions; use edgecap.runtime.precisions"
        )
        assert path in RUNTIMES_HOME or not is_runtime_list(strings, RUNTIME_NAMES), (
            f"{path.relative_to(ROOT)}:{line}: {strings} re-lists runtimes; ask edgecap.runtime.backends.registry"
        )


def test_no_private_onnxruntime_api() -> None:
    """``InferenceSession._sess`` is onnxruntime's private C++ session; it can change in any release."""
    uses = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "_sess"
    ]
    assert not uses, f"private onnxruntime API (._sess) used at {uses}"


#: Notes that are not part of the repository: code and docs cite papers and the project's own docs/ only.
OUTSIDE_NOTES = re.compile(r"(?<![\w.])shared/|environment-findings|reference-code", re.IGNORECASE)


def test_no_reference_to_notes_outside_the_repository() -> None:
    assert OUTSIDE_NOTES.search("see shared/reference/notes.md") and not OUTSIDE_NOTES.search("/dev/shm, a_shared/x")
    files = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "README.md",
        *(ROOT / "research").glob("*.py"),
    ]
    hits = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(files)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE_NOTES.search(line)
    ]
    assert not hits, f"references to notes outside the repository: {hits}"
