"""The runtime half imports numpy, Pillow and the inference engine only (docs/architecture.md, "Two installs").

Statically: the module-level imports reachable from the runtime entry points (``Captioner``, the ONNX Runtime
adapter, the decoding package, the bundle reader, ``edgecap caption``) never reach a training-side module or a
``[train]``-only package. Imports inside functions are how the torch runtime and the torch backbone stay
available without being loaded; ``tests/test_captioner_bundle.py`` runs a real script and checks ``sys.modules``.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgecap"

#: What an edge script, ``edgecap caption`` and the ONNX Runtime adapter import first.
ENTRY_POINTS = (
    "edgecap",
    "edgecap.runtime.captioner",
    "edgecap.runtime.captioning",
    "edgecap.runtime.backends",
    "edgecap.runtime.backends.onnxruntime.session",
    "edgecap.runtime.backends.bridge",
    "edgecap.runtime.backends.onnxruntime.decoders",
    "edgecap.runtime.images.inputs",
    "edgecap.runtime.backends.tensorrt.runtime",
    "edgecap.runtime.engines.build",
    "edgecap.cli.engine",
    "edgecap.runtime.decoding",
    "edgecap.runtime.bundle.reader",
    "edgecap.runtime.images.preprocess",
    "edgecap.runtime.vocab",
    "edgecap.cli",
    "edgecap.cli.caption",
)
#: The training side: never reached from the entry points at import time.
TRAINING_SIDE = (
    "edgecap.build.training",
    "edgecap.build.models",
    "edgecap.build.export",
    "edgecap.build.export.calibration",
    "edgecap.build.evaluation",
    "edgecap.build.data.synthetic",
    "edgecap.build.data.feature_cache",
    "edgecap.build.runs",
    "edgecap.build.quickstart",
)
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
#: Third-party modules the runtime entry points may import at import time -> the distribution that provides them,
#: which must be a base dependency in pyproject.toml (the runtime-only install has nothing else).
BASE_IMPORTS = {
    "numpy": "numpy",
    "PIL": "pillow",
    "click": "click",
    "psutil": "psutil",
    "packaging": "packaging",  # edgecap.runtime._versions: every version comparison
}


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    base = PACKAGE.parent.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_imports(name: str, path: Path) -> set[str]:
    """Modules imported when ``name`` is imported: every import outside function bodies and TYPE_CHECKING."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names if _module_file(f"{module}.{alias.name}"))
            for field in ("body", "orelse", "finalbody", "handlers"):
                child = getattr(node, field, None)
                if isinstance(child, list):
                    visit([c for c in child if isinstance(c, ast.stmt)] if field != "handlers" else [])
                    if field == "handlers":
                        for handler in child:
                            visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return found


def _closure() -> dict[str, str]:
    """Every module reachable at import time from the entry points -> the module that first imported it."""
    seen: dict[str, str] = {}
    todo = [(entry, "<entry point>") for entry in ENTRY_POINTS]
    while todo:
        name, parent = todo.pop()
        if name in seen:
            continue
        seen[name] = parent
        if not name.startswith("edgecap"):
            continue
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # packages run first
        todo.extend((p, name) for p in parents if p not in seen)
        path = _module_file(name)
        if path is not None:
            todo.extend((child, name) for child in _import_time_imports(name, path) if child not in seen)
    return seen


def test_runtime_modules_never_import_the_training_side():
    closure = _closure()
    bad = {
        module: parent
        for module, parent in closure.items()
        if any(module == side or module.startswith(side + ".") for side in TRAINING_SIDE)
        or module.split(".")[0] in TRAIN_ONLY
    }
    assert not bad, f"runtime-side imports reach the training side or [train]-only packages: {bad}"


def test_the_closure_covers_the_runtime_path():
    closure = _closure()  # guards against a walker that silently finds nothing
    for module in (
        "edgecap.runtime.decoding.beam",
        "edgecap.runtime.bundle.manifest",
        "edgecap.runtime.backends.registry",
        "numpy",
        "PIL",
    ):
        assert module in closure


def test_the_runtime_imports_only_declared_base_dependencies():
    tomllib = pytest.importorskip("tomllib")
    third_party = {
        module.split(".")[0]
        for module in _closure()
        if not module.startswith("edgecap") and module.split(".")[0] not in sys.stdlib_module_names
    }
    unlisted = third_party - set(BASE_IMPORTS)
    assert not unlisted, f"the runtime imports {unlisted}: add them to BASE_IMPORTS and pyproject.toml's dependencies"
    assert "packaging" in third_party
    declared = {
        re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower()
        for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    missing = {module: dist for module, dist in BASE_IMPORTS.items() if dist not in declared}
    assert not missing, f"the runtime imports these, but pyproject.toml's dependencies lack them: {missing}"
