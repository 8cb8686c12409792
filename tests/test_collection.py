"""Every test file runs: the README's test command collects each ``tests/**/test_*.py`` and finds items in it.

pytest skips folders named ``build``, ``dist``, ``venv`` ... unless ``norecursedirs`` says otherwise; a third of the
suite once went uncollected that way and nothing noticed. This guard runs the README's own pytest arguments with
``--collect-only`` and names every file that dropped out, or that collected nothing without saying why (a
module-level skip with a reason counts as collected: it is reported).
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: An item (``-q``: ``path::name``) or a file's count (``-qq``: ``path: N``).
_ITEM = re.compile(r"^(tests/\S+?\.py)(?:::|: [1-9])")
_MODULE_SKIP = re.compile(r"^SKIPPED \[\d+\] (tests/\S+?\.py)(?::\d+)?: ")


def readme_pytest_args() -> list[str]:
    """The arguments after ``python -m pytest`` in the README's test command, without xdist's ``-n N``."""
    readme = (ROOT / "README.md").read_text()
    command = next(b for b in re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S) if "pytest" in b)
    args = command.split("python -m pytest", 1)[1].split("&&")[0].split()
    kept: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg == "-n":
            skip_next = True
        elif not arg.startswith("-n"):
            kept.append(arg)
    return kept


def uncollected_test_files(root: Path, args: list[str]) -> list[str]:
    """Test files under ``root/tests`` that ``pytest ARGS --collect-only`` neither collects items from nor skips."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--collect-only", "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = set()
    for line in result.stdout.splitlines():
        match = _ITEM.match(line) or _MODULE_SKIP.match(line)
        if match:
            seen.add(match.group(1))
    files = sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))
    return [f for f in files if f not in seen]


def test_the_readme_command_collects_every_test_file():
    missing = uncollected_test_files(ROOT, readme_pytest_args())
    assert not missing, f"the README's test command does not collect: {missing}"


def test_the_guard_names_a_folder_that_pytest_skips(tmp_path):
    """A copy whose tests live under ``build/`` with pytest's default ``norecursedirs``: the guard names the file."""
    (tmp_path / "tests" / "build").mkdir(parents=True)
    (tmp_path / "tests" / "test_top.py").write_text("def test_top():\n    pass\n")
    (tmp_path / "tests" / "build" / "test_hidden.py").write_text("def test_hidden():\n    pass\n")
    (tmp_path / "tests" / "test_empty.py").write_text("X = 1\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    assert uncollected_test_files(tmp_path, ["-q"]) == ["tests/build/test_hidden.py", "tests/test_empty.py"]
