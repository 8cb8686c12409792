"""The calibration package's modules import one another without cycles, counting imports inside functions.

A cycle hidden in a function-level import works until someone moves that import to the top; keeping the graph
acyclic keeps the layout (entry point ``quantize`` -> ``int8`` -> graph, Q/DQ, calibration and onnxruntime helpers)
honest.
"""

from __future__ import annotations

import ast
from pathlib import Path

import edgecap.workshop.export.calibration as calibration

PACKAGE = calibration.__name__
ROOT = Path(calibration.__file__).parent


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports anywhere in its body (top level and inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:  # from <package> import <submodule>
                found.update(a.name for a in node.names if (ROOT / f"{a.name}.py").is_file())
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module[len(PACKAGE) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(
                a.name[len(PACKAGE) + 1 :].split(".")[0] for a in node.names if a.name.startswith(PACKAGE + ".")
            )
    return found - {path.stem}


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p) for p in ROOT.glob("*.py") if p.stem != "__init__"}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or ``[]``."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        state[module] = 2
        path.pop()
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return []


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_calibration_modules_import_each_other_without_cycles() -> None:
    graph = _graph()
    assert {"quantize", "int8", "graph_utils", "qdq_utils", "calib_utils", "onnxruntime_utils"} <= set(graph)
    assert _cycle(graph) == []


def test_the_helpers_do_not_import_the_entry_point() -> None:
    graph = _graph()
    helpers = ("int8", "graph_utils", "qdq_utils", "calib_utils", "onnxruntime_utils", "schemes")
    assert {h: graph[h] & {"quantize"} for h in helpers} == dict.fromkeys(helpers, set())
    assert graph["qdq_utils"] == set()  # pure onnx graph edits
