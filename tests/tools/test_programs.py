"""The repository's programs outside the wheel (``tools/``, ``research/``): one CLI framework (click) across the
codebase, public ``edgecap`` names only, no ``sys.path`` edits, the package never importing them, and every command
the docs give naming a real module and real flags."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from tools import run_program

ROOT = Path(__file__).resolve().parents[2]
PROGRAM_DIRS = ("tools", "research")
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "research" / "README.md", *(ROOT / "docs").glob("*.md")]
#: ``python -m tools.NAME ...`` or ``python3 -m research.NAME ...`` up to the end of its (continued) line.
COMMAND = re.compile(r"python3? -m (tools|research)\.(\w+)([^`\n]*)")


def _sources(*folders: str) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _imported(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module, [alias.name for alias in node.names]


def private_edgecap_imports(tree: ast.Module) -> list[str]:
    """``module:name`` of every import of a private ``edgecap`` module or name (``_io``, ``_registry``, ``_x``)."""
    bad = []
    for line, module, names in _imported(tree):
        if module.split(".")[0] != "edgecap":
            continue
        private = [part for part in module.split(".") if part.startswith("_")]
        private += [name for name in names if name.startswith("_")]
        bad += [f"{line}:{module}:{name}" for name in private]
    return bad


def sys_path_edits(tree: ast.Module) -> list[int]:
    """Lines that change ``sys.path`` (a call of one of its methods, or an assignment to it)."""
    lines = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, ast.Assign | ast.AugAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            target = target.value if isinstance(target, ast.Subscript) else target
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "path"
            and isinstance(target.value, ast.Name)
            and target.value.id == "sys"
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_codebase_has_one_cli_framework() -> None:
    users = [
        f"{path.relative_to(ROOT)}:{line}"
        for path, tree in _sources("edgecap", *PROGRAM_DIRS)
        for line, module, _ in _imported(tree)
        if module == "argparse"
    ]
    assert not users, f"command lines take their arguments with click, not argparse: {users}"


def test_programs_use_public_edgecap_names_and_leave_sys_path_alone() -> None:
    bad = {
        str(path.relative_to(ROOT)): [*private_edgecap_imports(tree), *map(str, sys_path_edits(tree))]
        for path, tree in _sources(*PROGRAM_DIRS)
    }
    assert not {k: v for k, v in bad.items() if v}


def test_the_checks_catch_what_they_look_for() -> None:
    tree = ast.parse(
        "import sys\nfrom edgecap.runtime._io import atomic_write_json\nfrom edgecap.workshop.models import _ort\n"
        "from edgecap.runtime.captioner import Captioner\nsys.path.append('x')\nsys.path[:0] = ['y']\n"
        "sys.path = []\nprint(sys.path)\n"
    )
    assert private_edgecap_imports(tree) == [
        "2:edgecap.runtime._io:_io",
        "3:edgecap.workshop.models:_ort",
    ]
    assert sys_path_edits(tree) == [5, 6, 7]


def test_the_package_never_imports_the_programs() -> None:
    users = [
        f"{path.relative_to(ROOT)}:{line}"
        for path, tree in _sources("edgecap")
        for line, module, _ in _imported(tree)
        if module.split(".")[0] in PROGRAM_DIRS
    ]
    assert not users, f"the wheel holds edgecap only: {users}"


def _options(path: Path) -> set[str]:
    """Every ``--flag`` a program's click options declare (read from its source: a study imports torch)."""
    flags = {"--help"}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "option":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    flags |= {f for f in re.split(r"[/ ]", arg.value) if f.startswith("--")}
    return flags


def documented_commands() -> list[tuple[str, str, str, list[str]]]:
    """(doc, folder, module, flags) of every documented program command (continuation lines joined)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for folder, module, rest in COMMAND.findall(text):
            words = rest.split("#")[0].split()
            found.append((doc.name, folder, module, [w.split("=")[0] for w in words if w.startswith("--")]))
    return found


def test_every_documented_program_command_names_a_module_and_its_flags() -> None:
    commands = documented_commands()
    assert {"serving", "collection", "stream", "gpu_check"} <= {m for _, f, m, _ in commands if f == "tools"}
    bad = []
    for doc, folder, module, flags in commands:
        if module.isupper():  # a placeholder: ``python -m tools.NAME``
            continue
        path = ROOT / folder / f"{module}.py"
        if not path.is_file():
            bad.append(f"{doc}: {folder}.{module} does not exist")
            continue
        unknown = sorted(set(flags) - _options(path))
        if unknown:
            bad.append(f"{doc}: {folder}.{module} has no {unknown}")
    assert not bad, bad


@click.command()
@click.option("--count", type=click.IntRange(min=1), required=True)
def _counting(count: int) -> int:
    return 0 if count < 3 else 5


@pytest.mark.parametrize(("argv", "status"), [(["--count", "1"], 0), (["--count", "4"], 5), (["--help"], 0)])
def test_a_program_s_status_is_what_its_command_returns(argv: list[str], status: int) -> None:
    assert run_program(_counting, argv) == status


def test_a_usage_error_is_one_message_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_program(_counting, ["--count", "0"]) == 2
    err = capsys.readouterr().err
    assert "Error: Invalid value for '--count'" in err and "Traceback" not in err
