"""The two halves and the import graph (docs/architecture.md, "Two halves").

``edgecap.runtime`` is what a device imports: numpy, Pillow and an inference engine only, at module level and inside
functions alike. ``edgecap.workshop`` (torch) builds on it and is never imported from it: it plugs its torch runtimes
and hooks in through entry points, so no runtime module names it, not even in a string. These tests read every import
of the package with ``ast`` — import statements at module level, inside functions and methods, inside ``try`` blocks,
and ``importlib.import_module``/``__import__`` calls with a literal name — so a function-level or dynamic import
cannot hide a dependency or a cycle. ``tests/test_edge_install.py`` imports every one of them in a runtime-only venv.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgecap"

#: Packages only the [train] extra installs.
TRAIN_ONLY = (
    "torch",
    "torchvision",
    "timm",
    "onnx",
    "onnxscript",
    "matplotlib",
    "pycocoevalcap",
    "safetensors",
    "rich",
)
#: Third-party modules the runtime half may import -> the distribution that provides them, which must be a base
#: dependency in pyproject.toml (the runtime-only install has nothing else).
BASE_IMPORTS = {
    "numpy": "numpy",
    "PIL": "pillow",
    "click": "click",
    "psutil": "psutil",
    "packaging": "packaging",  # edgecap.runtime._versions: every version comparison
}
#: Inference engines the runtime half may import where they are used -> the extras that install them. ``onnx`` is
#: part of the TensorRT engine build (the ONNX parser's input) and of the optional graph check of a bundle; the
#: ONNX Runtime path never needs it.
ENGINE_IMPORTS = {
    "onnxruntime": ("cpu", "gpu-cu12", "gpu-cu13"),
    "tensorrt": ("tensorrt-cu12", "tensorrt-cu13"),
    "cuda": ("tensorrt-cu12", "tensorrt-cu13"),
    "onnx": ("tensorrt-cu12", "tensorrt-cu13"),
}
#: Runtime modules that reach a serving or scaling engine, each only where it is used: the Triton client (the
#: [client] extra), the Python backend's own module (it exists only inside Triton's backend stub) and Ray (the [ray]
#: extra; Ray Data's blocks are pyarrow tables, which ray[data] installs). Every other runtime module stays on the
#: lists above.
MODULE_ENGINES: dict[str, set[str]] = {
    "edgecap.runtime.serving.client": {"tritonclient"},
    "edgecap.runtime.serving.triton_model": {"triton_python_backend_utils"},
    "edgecap.runtime.collections.ray_job": {"ray", "pyarrow"},
    # the stream sources: video through PyAV (the [stream] extra), GStreamer pipelines through OpenCV (JetPack's),
    # imported inside the functions that open those kinds only
    "edgecap.runtime.stream.sources_av": {"av"},
    "edgecap.runtime.stream.sources_cv": {"cv2"},
}
#: The workshop half and what it may never import: the benchmark and the command line sit above both halves.
WORKSHOP = "edgecap.workshop"
ABOVE_THE_WORKSHOP = ("edgecap.bench", "edgecap.cli")
#: Runtime modules allowed to name the workshop half in a string: none.
WORKSHOP_NAMERS: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _skipped(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING`` (annotations only: they never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skip


def _dynamic_import(node: ast.AST) -> str | None:
    """The literal module name of ``importlib.import_module("x")``, ``import_module("x")`` or ``__import__("x")``."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func, first = node.func, node.args[0]
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__"):
        return None
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
        return first.value
    return None


def imports_in(name: str, source: str, is_package: bool = False) -> set[str]:
    """The modules the source of module ``name`` imports anywhere that can run (not under ``if TYPE_CHECKING``):
    import statements, where ``from pkg import sub`` counts ``pkg.sub`` when it is a module, and dynamic imports of a
    literal name."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(source)
    skip = _skipped(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        dynamic = _dynamic_import(node)
        if dynamic is not None:
            found.add(dynamic)
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES)
    return found


def imports_of(name: str, path: Path) -> set[str]:
    return imports_in(name, path.read_text(), is_package=path.name == "__init__.py")


def workshop_strings(source: str) -> list[str]:
    """The strings of ``source`` that name the workshop half (docstrings aside: they may point a reader there)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and re.search(rf"\b{re.escape(WORKSHOP)}\b", node.value)
    ]


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {node: sorted(n for n in targets if n in graph and n != node) for node, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_walker_sees_imports_inside_functions() -> None:
    assert "edgecap.runtime.torch_hooks" in GRAPH["edgecap.runtime.backends.bridge"]  # imported inside array_ops
    assert "edgecap.runtime.backends.onnxruntime.decoders" in GRAPH["edgecap.runtime.backends.onnxruntime.loader"]


def test_the_walker_sees_dynamic_imports_of_literal_names() -> None:
    source = """
import importlib
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    importlib.import_module("annotations_only")

def caption(name):
    importlib.import_module("torch")
    import_module("timm.layers")
    __import__("edgecap.workshop.runs")
    return importlib.import_module(name)  # a variable: a registry's own lookup, not a dependency
"""
    found = imports_in("edgecap.runtime.mutant", source)
    assert {"torch", "timm.layers", "edgecap.workshop.runs"} <= found
    assert "annotations_only" not in found and "name" not in found


def test_a_runtime_module_importing_torch_inside_a_function_is_caught() -> None:
    """The mutant the rule exists for: ``importlib.import_module("torch")`` in a runtime function."""
    source = 'import importlib\n\ndef f():\n    return importlib.import_module("torch")\n'
    assert runtime_violations("edgecap.runtime.mutant", imports_in("edgecap.runtime.mutant", source)) == ["torch"]
    clean = "import importlib\n\ndef f(name):\n    return importlib.import_module(name)\n"
    assert runtime_violations("edgecap.runtime.mutant", imports_in("edgecap.runtime.mutant", clean)) == []


def test_a_string_naming_the_workshop_half_is_caught() -> None:
    source = '''"""Docstrings may point at edgecap.workshop.runs."""

LOADER = "edgecap.workshop.torch_runtime.loader:load_bundle_runtime"

def f():
    """Here too: edgecap.workshop.export."""
    return f"see {LOADER}", "edgecap.workshopping is another word"
'''
    assert workshop_strings(source) == ["edgecap.workshop.torch_runtime.loader:load_bundle_runtime"]


def test_no_import_cycles_counting_function_level_imports() -> None:
    assert cycles(GRAPH) == []


def _third_party(module: str) -> str | None:
    top = module.split(".")[0]
    return None if top in ("edgecap", "") or top in sys.stdlib_module_names else top


RUNTIME = {
    name: path
    for name, path in MODULES.items()
    if name in ("edgecap.runtime", "edgecap.client") or name.startswith("edgecap.runtime.")
}


def test_each_engine_allowance_names_a_module_that_imports_it() -> None:
    """A stale allowance (a module renamed, or no longer needing its engine) would silently widen the rule."""
    for name, engines in MODULE_ENGINES.items():
        assert name in RUNTIME, f"MODULE_ENGINES names {name}, which is not a runtime module"
        used = {_third_party(module) for module in GRAPH[name]}
        assert engines <= used, f"{name} no longer imports {sorted(engines - used)}: drop it from MODULE_ENGINES"


def runtime_violations(name: str, imports: set[str]) -> list[str]:
    """What runtime module ``name`` may not import among ``imports``: anything of edgecap outside the runtime half,
    and any third-party module besides the base dependencies and its engines."""
    allowed = set(BASE_IMPORTS) | set(ENGINE_IMPORTS) | MODULE_ENGINES.get(name, set())
    return sorted(
        module
        for module in imports
        if (module.startswith("edgecap.") and not module.startswith(("edgecap.runtime", "edgecap._version")))
        or (_third_party(module) is not None and _third_party(module) not in allowed)
    )


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_the_runtime_half_imports_only_numpy_pillow_and_engines(name: str) -> None:
    """At module level and inside functions, statically or by a literal name: no torch, no [train]-only package,
    nothing of the workshop half."""
    bad = runtime_violations(name, GRAPH[name])
    assert not bad, f"{name} imports {bad}: the runtime half imports numpy, Pillow and an inference engine only"


def test_no_runtime_module_names_the_workshop_half() -> None:
    """The workshop half plugs in through entry points (pyproject.toml): the runtime names none of its modules, not
    even as an import string resolved later."""
    namers = {name: found for name, path in RUNTIME.items() if (found := workshop_strings(path.read_text()))}
    assert set(namers) <= WORKSHOP_NAMERS, f"these runtime modules name the workshop half: {namers}"


def test_the_workshop_half_never_imports_the_benchmark_or_the_cli() -> None:
    """The workshop builds on the runtime only; what strings everything together (the quickstart) sits above."""
    bad = {
        name: sorted(m for m in GRAPH[name] if m.startswith(ABOVE_THE_WORKSHOP) or m in ABOVE_THE_WORKSHOP)
        for name in MODULES
        if name == WORKSHOP or name.startswith(f"{WORKSHOP}.")
    }
    assert not {name: found for name, found in bad.items() if found}


def test_the_torch_hooks_and_runtimes_are_plugged_in_by_the_workshop_half() -> None:
    """edgecap's own entry points register every hook and both torch runtimes (this needs the installed metadata of
    this checkout: ``pip install -e .``), each resolving to a workshop-half object."""
    from edgecap.runtime.backends import get_runtime
    from edgecap.runtime.torch_hooks import HOOK_NAMES, registered_torch_hooks, torch_hook

    hooks = registered_torch_hooks()
    assert sorted(hooks) == sorted(HOOK_NAMES)
    for name in HOOK_NAMES:
        assert hooks[name].target.startswith(f"{WORKSHOP}.") and torch_hook(name) is not None
    for runtime in ("torch", "torch-rerun"):
        assert get_runtime(runtime).load_function().__module__.startswith(f"{WORKSHOP}.torch_runtime")


def test_the_front_ends_reach_the_build_half_only_inside_functions() -> None:
    """``import edgecap``, the CLI and ``edgecap caption``/``engine``/``bench`` start without torch: their
    module-level imports stay in the runtime half (the commands that train or export import the workshop half when run).
    """
    entry_points = ["edgecap", "edgecap.cli", "edgecap.cli.caption", "edgecap.cli.engine", "edgecap.bench"]
    seen: set[str] = set()
    todo = list(entry_points)
    while todo:
        name = todo.pop()
        if name in seen or name not in MODULES:
            continue
        seen.add(name)
        tree = ast.parse(MODULES[name].read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in top:
            if isinstance(node, ast.ImportFrom) and node.module:
                todo.append(node.module)
                todo.extend(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo.extend(parents)
    bad = sorted(m for m in seen if m.startswith("edgecap.workshop") or m.split(".")[0] in TRAIN_ONLY)
    assert "edgecap.runtime.captioner" in seen or "edgecap.cli.caption" in seen
    assert not bad, f"module-level imports of the front ends reach {bad}"


def test_the_runtime_imports_only_declared_dependencies() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}

    declared = names(project["dependencies"])
    missing = {module: dist for module, dist in BASE_IMPORTS.items() if dist not in declared}
    assert not missing, f"the runtime imports these, but pyproject.toml's dependencies lack them: {missing}"
    extras = project["optional-dependencies"]
    for module, extra_names in ENGINE_IMPORTS.items():
        dist = {"cuda": "cuda-python", "tensorrt": "tensorrt-cu12"}.get(module, module)
        for extra in extra_names:
            wanted = dist.replace("-cu12", "-cu13") if extra.endswith("cu13") and dist.startswith("tensorrt") else dist
            wanted = "onnxruntime-gpu" if module == "onnxruntime" and extra.startswith("gpu") else wanted
            assert wanted in names(extras[extra]), f"[{extra}] should install {wanted} for `import {module}`"
