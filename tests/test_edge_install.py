"""The runtime-only install: ``pip install "<repo>[cpu]"`` into a fresh venv (and the same with the oldest supported
ONNX Runtime, 1.18.x, on numpy 1.x) imports edgecap without torch, captions a bundle exactly as the full install
(``Captioner.load`` and ``edgecap caption --json``) and runs ``edgecap bench``.

The venvs are built once per session with ``tools.edge_install`` (the footprint job,
``tests/jobs/test_edge_footprint.py``, measures the same environments): about 20 s each from the local package mirrors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_import_graph import TRAIN_ONLY  # one list of the [train]-only packages
from tools import edge_install as EDGE

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_gap() -> str | None:
    """Why ``pip install "<repo>[cpu]"`` is not the runtime-only install, or None when it is."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return "tomllib needs Python 3.11 to read pyproject.toml"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    heavy = [d for d in project["dependencies"] if re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0].lower() in TRAIN_ONLY]
    if heavy:
        return f"pyproject.toml requires {heavy} in every install"
    if "cpu" not in project.get("optional-dependencies", {}):
        return "pyproject.toml has no [cpu] extra"
    return None


@pytest.fixture(scope="session", params=sorted(EDGE.VARIANTS))
def runtime_venv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A runtime-only venv per variant (``cpu``, ``oldest-onnxruntime``), built once per session."""
    dest = tmp_path_factory.getbasetemp() / "edge-venvs" / request.param
    try:
        python = EDGE.variant_python(request.param)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return EDGE.build_runtime_venv(dest, ROOT, pins=EDGE.VARIANTS[request.param], python=python)


PROBE = f"""
import importlib.util, json, sys
import edgecap, edgecap.runtime.captioner, edgecap.runtime.backends
import numpy, onnxruntime
print(json.dumps({{
    "edgecap": edgecap.__file__, "torch_found": importlib.util.find_spec("torch") is not None,
    "imported": sorted(m for m in sys.modules if m.split(".")[0] in {sorted(TRAIN_ONLY)!r}),
    "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
    "available": edgecap.runtime.backends.list_runtimes(available=True),
}}))
"""


def test_runtime_install_imports_edgecap_without_torch(runtime_venv: Any) -> None:
    done = runtime_venv.run(PROBE)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(found["edgecap"]).is_relative_to(runtime_venv.path)  # the installed copy, not the checkout
    assert not found["torch_found"] and found["imported"] == []
    assert "torch" not in runtime_venv.packages
    assert "onnxruntime" in found["available"] and "torch" not in found["available"]
    if runtime_venv.pins:  # the oldest supported ONNX Runtime, on the numpy 1.x it was built for
        assert found["onnxruntime"].startswith("1.18.") and found["numpy"].startswith("1.")
    size = EDGE.venv_size(runtime_venv)
    assert 0 < size["without_installer_mb"] < size["total_mb"] and "onnxruntime" in size["largest_mb"]


#: Walks every import statement of the installed runtime half (module level, inside functions and methods, under
#: ``try``) and imports its target: the walk of tests/test_import_graph.py, executed where torch is absent.
WALK = """
import ast, importlib, json, pathlib, sys
import edgecap.runtime
root = pathlib.Path(edgecap.runtime.__file__).parent
missing, checked = {}, 0
for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root.parent.parent).with_suffix("")
    parts = list(rel.parts)
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    importlib.import_module(name)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            targets = [(module, a.name) for a in node.names]
        else:
            continue
        for module, attribute in targets:
            checked += 1
            try:
                imported = importlib.import_module(module)
                if attribute is not None and not hasattr(imported, attribute):
                    importlib.import_module(f"{module}.{attribute}")
            except ImportError as exc:
                missing.setdefault(module.split(".")[0], []).append(f"{name}: {module} ({exc})")
print(json.dumps({"checked": checked, "missing": missing, "torch": "torch" in sys.modules}))
"""


def test_every_import_of_the_runtime_half_resolves_without_torch(runtime_venv: Any) -> None:
    """Every module of ``edgecap.runtime`` and every import statement in it, function-level ones included, imports
    in the runtime-only venv; only engines of other extras (TensorRT, cuda-python, onnx) are absent there, and the
    engines of single modules (Ray, the Triton client) only in the modules allowed them."""
    from tests.test_import_graph import ENGINE_IMPORTS, MODULE_ENGINES

    done = runtime_venv.run(WALK)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["checked"] > 300 and not found["torch"]
    other_extras = {name for name, extras in ENGINE_IMPORTS.items() if "cpu" not in extras}
    module_only = {
        top: [where for where in found["missing"][top] if top not in MODULE_ENGINES.get(where.split(":")[0], set())]
        for top in set(found["missing"]) - other_extras
    }
    assert not any(module_only.values()), module_only


def test_the_cpu_extra_is_the_runtime_only_install() -> None:
    assert _pyproject_gap() is None


SESSIONS = """
import json, sys
import onnxruntime
for graph in json.loads(sys.argv[1]):
    onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
"""


CAPTION = """
import json, sys
from edgecap import Captioner
with Captioner.load(sys.argv[1]) as cap:
    print(json.dumps(cap.batch(json.loads(sys.argv[2]))))
"""


def test_captions_match_the_full_install(
    runtime_venv: Any, tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A bundle exported by this test run, captioned through ``edgecap caption --json`` and ``Captioner.load`` in the
    runtime-only venv, gives the full install's captions."""
    from edgecap.runtime.captioner import Captioner
    from tests.runtime.bundle.helpers import pixel_bundle

    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    graphs = sorted(str(p) for p in bundle.glob("onnx/*/*.onnx"))
    opened = runtime_venv.run(SESSIONS, json.dumps(graphs))  # this ONNX Runtime reads the exported graphs at all
    assert opened.returncode == 0, opened.stderr[-3000:]
    images = [str(p) for p in sorted((tiny_data[0] / "images").iterdir())[:4]]
    with Captioner.load(bundle) as cap:
        expected = cap.batch(images)
    env = {"EDGECAP_HOME": str(tmp_path / "home")}
    done = runtime_venv.run(CAPTION, str(bundle), json.dumps(images), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
    cli = EDGE.subprocess.run(
        [str(runtime_venv.edgecap), "caption", *images, "--model", str(bundle), "--json"],
        capture_output=True,
        text=True,
        env=EDGE.clean_env(env),
        cwd=runtime_venv.path,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert json.loads(cli.stdout) == dict(zip(images, expected, strict=True))


def test_edgecap_bench_runs_in_the_runtime_install(
    runtime_venv: Any, tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """``edgecap bench`` of the installed package, without torch, rich or matplotlib: ONNX Runtime measured from
    pixels, the torch runtimes skipped with the install hint, the plots left out with a note."""
    from tests.runtime.bundle.helpers import pixel_bundle

    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    images = tiny_data[0] / "images"
    args = ["bench", "--bundle", str(bundle), "--runtime", "onnxruntime,torch", "--images", str(images)]
    args += ["--max-images", "4"]
    args += ["--batch", "1", "--beam", "3", "--warmup", "1", "--min-repeats", "2", "--min-seconds", "0", "--quiet"]
    done = EDGE.subprocess.run(
        [str(runtime_venv.edgecap), *args, "--no-quality", "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        env=EDGE.clean_env({"EDGECAP_HOME": str(tmp_path / "home")}),
        cwd=runtime_venv.path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [(r["runtime"], r["backbone"]) for r in report["results"]] == [("onnxruntime", "graph")]
    assert "pip install 'edgecap[train]'" in report["skipped"][0]["reason"]
    assert any("need matplotlib" in note for note in report["notes"])


NO_ENGINE = """
import sys
from edgecap import Captioner
from edgecap.runtime.backends.registry import CaptionerError
try:
    Captioner.load(sys.argv[1])
except CaptionerError as exc:
    print(exc)
"""


def test_without_an_inference_engine_the_error_names_the_extra(
    tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """``pip install edgecap`` alone (no onnxruntime, no torch): loading a bundle and ``edgecap caption`` say which
    extra to install, instead of an ImportError."""
    from tests.runtime.bundle.helpers import pixel_bundle

    venv = EDGE.build_runtime_venv(tmp_path_factory.getbasetemp() / "edge-venvs" / "base", ROOT, extra=None)
    assert "onnxruntime" not in venv.packages and "torch" not in venv.packages
    bundle, _ = pixel_bundle(tiny_data, tmp_path_factory)
    done = venv.run(NO_ENGINE, str(bundle), env={"EDGECAP_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "edgecap[cpu]" in done.stdout and "edgecap[gpu]" in done.stdout
    image = str(next((tiny_data[0] / "images").iterdir()))
    cli = EDGE.subprocess.run(
        [str(venv.edgecap), "caption", image, "--model", str(bundle)],
        capture_output=True,
        text=True,
        env=EDGE.clean_env({"EDGECAP_HOME": str(tmp_path / "home")}),
        cwd=venv.path,
        check=False,
    )
    assert cli.returncode != 0 and "edgecap[cpu]" in cli.stderr and "Traceback" not in cli.stderr
