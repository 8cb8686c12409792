"""Packaging promises: cheap imports, a working --help, and the README's commands agreeing with CI."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_import_edgecap_loads_no_heavy_backend():
    loaded = _modules_after("import edgecap, edgecap.runtime.backends, edgecap.runtime.decoding.config")
    assert not {"onnxruntime", "tensorrt", "timm"} & loaded


def test_cli_help_imports_neither_torch_nor_backends():
    loaded = _modules_after(
        "from click.testing import CliRunner\nfrom edgecap.cli import main\n"
        "r = CliRunner().invoke(main, ['--help'])\nassert r.exit_code == 0, r.output"
    )
    assert not {"torch", "onnxruntime", "tensorrt", "timm"} & loaded


def test_every_registered_command_has_help():
    from click.testing import CliRunner

    from edgecap.cli import COMMANDS, main

    for name in COMMANDS:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    ci = (ROOT / ".ci" / "run").read_text()
    test_commands = [b for b in blocks if "pytest" in b]
    assert len(test_commands) == 1 and test_commands[0] in ci.splitlines()
    assert any("edgecap quickstart" in b for b in blocks)


def test_a_training_command_without_the_training_stack_says_what_to_install(monkeypatch):
    """In a runtime-only install a [train]-only import fails inside the command; the CLI turns it into one line."""
    import builtins
    import importlib.util

    from click.testing import CliRunner

    from edgecap.cli import main

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    real_find_spec = importlib.util.find_spec

    def no_torch_spec(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        return None if name.split(".")[0] == "torch" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    monkeypatch.setattr(importlib.util, "find_spec", no_torch_spec)
    result = CliRunner().invoke(main, ["zoo"])
    assert result.exit_code == 1 and "`edgecap zoo` needs the training stack" in result.output
    assert "pip install 'edgecap[train]'" in result.output and "Traceback" not in result.output
