"""``edgecap.bench`` holds the ``edgecap bench`` feature only: every module in it is reached from the command
(``edgecap/cli/bench.py``, ``bench_options.py``) through imports; measurement programs live in ``tools/``."""

from __future__ import annotations

import ast
from pathlib import Path

import edgecap

PACKAGE = Path(edgecap.__file__).resolve().parent
BENCH = PACKAGE / "bench"
COMMAND = [PACKAGE / "cli" / "bench.py", PACKAGE / "cli" / "bench_options.py"]


def bench_modules_named(path: Path) -> set[str]:
    """The ``edgecap.bench`` modules ``path`` imports, or names in a lazy import string (``"edgecap.bench.run"``)."""
    named = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        modules: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules = [node.value.split(":")[0]]
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["edgecap", "bench"] and len(parts) > 2 and (BENCH / f"{parts[2]}.py").is_file():
                named.add(parts[2])
    return named


def reached_from(files: list[Path]) -> set[str]:
    """Every ``edgecap.bench`` module ``files`` reach through imports."""
    seen: set[str] = set()
    todo = set().union(*(bench_modules_named(f) for f in files))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo |= bench_modules_named(BENCH / f"{module}.py")
    return seen


def test_every_bench_module_serves_the_bench_command() -> None:
    modules = {p.stem for p in BENCH.glob("*.py")}
    reached = reached_from([*COMMAND, BENCH / "__init__.py"]) | {"__init__"}
    assert modules - reached == set(), "a program belongs in tools/, not in the wheel"


def test_the_reach_follows_imports_only(tmp_path: Path) -> None:
    command = tmp_path / "command.py"
    command.write_text("from edgecap.bench.report import write_report\n")
    reached = reached_from([command])
    assert {"report", "results", "markdown", "plots"} <= reached and "series" not in reached
