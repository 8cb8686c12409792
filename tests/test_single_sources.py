"""Each extension point has one list: the package source holds no second list of precisions or runtimes (nor of
which runtime runs which precision), no private onnxruntime API, no second reader of ``/proc/cpuinfo``, and no
pointer to notes outside the repository.

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
#: The one module that reads ``/proc/cpuinfo``: CPU name, flags and cores come from there.
CPU_FACTS_HOME = PACKAGE / "runtime" / "backends" / "cpu.py"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


SET_CALLS = ("set", "frozenset")


def _literal_strings(node: ast.AST) -> list[str] | None:
    """The string elements of a tuple/list/set literal (None for anything else)."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _string_pair(node: ast.AST) -> tuple[str, str] | None:
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        a, b = node.elts
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in (a, b)):
            return a.value, b.value  # type: ignore[attr-defined]
    return None


def _collections(path: Path) -> Iterator[tuple[int, list[str], bool]]:
    return _collections_of(ast.parse(path.read_text(), filename=str(path)))


def _collections_of(tree: ast.AST) -> Iterator[tuple[int, list[str], bool]]:
    """``(line, strings, is_set)`` for each literal collection of strings; ``is_set`` for a set literal and for the
    literal inside ``set(...)``/``frozenset(...)``."""
    set_args = {
        id(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SET_CALLS and node.args
    }
    for node in ast.walk(tree):
        strings = _literal_strings(node)
        if strings is None and isinstance(node, ast.Dict) and all(isinstance(v, ast.Constant) for v in node.values):
            # a dict of names to constants (an order, labels) is a list of them too; per-name data (tolerances) is not
            strings = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        if strings:
            yield node.lineno, strings, isinstance(node, ast.Set) or id(node) in set_args


def _pair_collections_of(tree: ast.AST) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """``(line, pairs)`` for each literal collection (tuple, list, set, or a dict's keys) made only of 2-tuples of
    strings."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items: list[ast.expr | None] = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        else:
            continue
        pairs = [_string_pair(item) for item in items if item is not None]
        if items and len(pairs) == len(items) and all(pair is not None for pair in pairs):
            yield node.lineno, [pair for pair in pairs if pair is not None]


def is_precision_list(strings: list[str]) -> bool:
    """Every precision, or both float precisions: a re-listing of :data:`PRECISIONS`/:data:`FLOAT_PRECISIONS`.
    A preference among some of them (``("int8", "fp16")``) or per-precision values are data, not a list."""
    return set(PRECISIONS) <= set(strings) or (set(FLOAT_PRECISIONS) == set(strings) and len(strings) >= 2)


def is_precision_set(strings: list[str]) -> bool:
    """Two or more precisions and nothing else, as a set: a membership test of which precisions have some property,
    a second list of them (an order among some of them, as a tuple, is data)."""
    return len(set(strings)) >= 2 and set(strings) <= set(PRECISIONS)


def is_runtime_list(strings: list[str], names: set[str]) -> bool:
    """Two or more runtime names and nothing else (package-name lists such as ``("torch", "onnx", ...)`` hold
    other names too)."""
    return len(set(strings) & names) >= 2 and set(strings) <= names


def is_runtime_precision_list(pairs: list[tuple[str, str]], names: set[str]) -> bool:
    """A collection of ``(runtime, precision)`` pairs (either order): a second list of which runtime runs (or
    cannot run) which precision, which :attr:`RuntimeSpec.precisions` holds."""
    return any((a in names and b in PRECISIONS) or (a in PRECISIONS and b in names) for a, b in pairs)


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def cpuinfo_paths(tree: ast.AST) -> list[int]:
    """Lines of the strings that spell the ``/proc/cpuinfo`` path or its last part (a reader), docstrings aside."""
    docstrings = _docstrings(tree)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and ("/proc/cpuinfo" in node.value or node.value.strip("/") == "cpuinfo")
    )


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
    found = [strings for _, strings, _ in sorted(_collections_of(tree))]
    assert len(found) == 3  # the tolerances: per-precision data, not a list
    assert [is_runtime_list(s, RUNTIME_NAMES) for s in found] == [True, False, True]
    assert [is_precision_list(s) for s in found] == [False, True, False]
    assert any(isinstance(n, ast.Attribute) and n.attr == "_sess" for n in ast.walk(tree))


def test_the_set_detector_catches_set_literals_and_set_calls() -> None:
    old = (
        'REDUCED = {"fp16", "int8"}\nHALF = frozenset({"int8", "fp16"})\nLOW = set(["fp16", "int8"])\n'
        'Q = frozenset(("int8", "fp16"))\nTORCHES = {"torch", "torch-rerun"}\n'
        # neighbours: an order of preference, one name, other names, a set of a name and options
        'prefer = ("int8", "fp16")\nonly = {"fp32"}\nmethods = frozenset({"entropy", "percentile"})\n'
        'asked = {"fp32", *extra}\n'
    )
    found = sorted(_collections_of(ast.parse(old)))
    flagged = [
        line
        for line, strings, is_set in found
        if (is_set and is_precision_set(strings))
        or is_precision_list(strings)
        or is_runtime_list(strings, RUNTIME_NAMES)
    ]
    assert flagged == [1, 2, 3, 4, 5]
    assert [is_set for line, _, is_set in found if line <= 6] == [True, True, True, True, True, False]


def test_the_pair_detector_catches_which_runtime_runs_which_precision() -> None:
    old = (
        'UNSUPPORTED = {("torch", "int8"), ("torch-rerun", "int8")}\nSKIP = [("int8", "torch")]\n'
        'NOTES = {("onnxruntime", "fp16"): "slow on CPU"}\nRUNS = frozenset({("ort", "fp32"), ("tensorrt", "fp16")})\n'
        # neighbours: named comparisons of two combinations, a grid of batch sizes, pairs of other names
        'COMPARE = (("int8 vs fp32", ("onnxruntime", "int8"), ("onnxruntime", "fp32")),)\n'
        'grid = [(1, "fp32"), (8, "int8")]\nproviders = [("tensorrt", "trt"), ("cuda", "gpu")]\n'
    )
    flagged = sorted(
        line for line, pairs in _pair_collections_of(ast.parse(old)) if is_runtime_precision_list(pairs, RUNTIME_NAMES)
    )
    assert flagged == [1, 2, 3, 4]


def test_the_cpuinfo_detector_sees_readers_not_docstrings() -> None:
    old = (
        '"""Reads /proc/cpuinfo."""\ndef model():\n    """From /proc/cpuinfo."""\n'
        '    return Path("/proc/cpuinfo").read_text()\nFLAGS = open("/proc/cpuinfo")\n'
        'TEXT = (Path("/proc") / "cpuinfo").read_text()\nSTAT = Path("/proc/stat").read_text()\n'
        '__all__ = ["parse_cpuinfo"]\n'
    )
    assert cpuinfo_paths(ast.parse(old)) == [4, 5, 6]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_second_list_of_precisions_or_runtimes(path: Path) -> None:
    where = path.relative_to(ROOT)
    for line, strings, is_set in _collections(path):
        assert path == PRECISIONS_HOME or not is_precision_list(strings), (
            f"{where}:{line}: {strings} re-lists the precisions; use edgecap.runtime.precisions"
        )
        assert path == PRECISIONS_HOME or not (is_set and is_precision_set(strings)), (
            f"{where}:{line}: {strings} is a set of precisions; name the property in edgecap.runtime.precisions"
        )
        assert path in RUNTIMES_HOME or not is_runtime_list(strings, RUNTIME_NAMES), (
            f"{where}:{line}: {strings} re-lists runtimes; ask edgecap.runtime.backends.registry"
        )
    for line, pairs in _pair_collections_of(ast.parse(path.read_text(), filename=str(path))):
        assert not is_runtime_precision_list(pairs, RUNTIME_NAMES), (
            f"{where}:{line}: {pairs} lists which runtime runs which precision; ask the runtime's "
            "RuntimeSpec.precisions (edgecap.runtime.backends.registry)"
        )


def test_the_homes_are_where_the_lists_are() -> None:
    """The exemptions name files that exist and hold the lists, so a move cannot leave them pointing nowhere."""
    assert any(is_precision_list(s) for _, s, _ in _collections(PRECISIONS_HOME))
    assert all(path.is_file() for path in RUNTIMES_HOME)
    assert "precisions=" in (PACKAGE / "runtime" / "backends" / "__init__.py").read_text()


def test_only_the_cpu_module_reads_proc_cpuinfo() -> None:
    readers = {path for path in _sources() if cpuinfo_paths(ast.parse(path.read_text(), filename=str(path)))}
    assert readers == {CPU_FACTS_HOME}, f"/proc/cpuinfo read outside {CPU_FACTS_HOME.relative_to(ROOT)}: {readers}"


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
