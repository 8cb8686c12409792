"""Old module paths (before the runtime/build split) import the new modules, warn once, and stay off the disk."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import edgecap
from edgecap.runtime._moved import MOVED, MovedModuleFinder, install, new_module_name

ROOT = Path(__file__).resolve().parents[2]


def _module_path(name: str) -> Path:
    return ROOT.joinpath(*name.split("."))


@pytest.fixture
def fresh_old_names() -> Iterator[None]:
    """Forget every old name already imported, so the next import goes through the finder (and warns) again."""
    saved = {name: module for name, module in sys.modules.items() if new_module_name(name) is not None}
    for name in saved:
        del sys.modules[name]
    yield
    sys.modules.update(saved)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_warning(old: str, fresh_old_names: None) -> None:
    new = MOVED[old]
    with pytest.warns(FutureWarning) as caught:  # an old parent not yet imported warns too
        module = importlib.import_module(old)
    assert f"{old} moved to {new}; the old path will be removed" in [str(w.message) for w in caught]
    assert module is importlib.import_module(new) is sys.modules[old]
    assert module.__name__ == new and module.__spec__.name == new  # the module keeps its own identity
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is module  # once: the second import is sys.modules' entry


def test_the_warning_points_at_the_import_statement(fresh_old_names: None) -> None:
    with pytest.warns(FutureWarning) as caught:
        import edgecap.runtimes.onnxruntime_session  # noqa: F401
    assert {Path(w.filename) for w in caught} == {Path(__file__)}
    assert [str(w.message).split()[0] for w in caught] == ["edgecap.runtimes", "edgecap.runtimes.onnxruntime_session"]


def test_old_style_imports_of_names_and_submodules(fresh_old_names: None) -> None:
    from edgecap.runtime.backends.bridge import RuntimeStepModel as bridge_model
    from edgecap.runtime.backends.onnxruntime import session
    from edgecap.runtime.backends.onnxruntime.session import OnnxRuntimeSession as new_session

    with pytest.warns(FutureWarning):
        from edgecap.data.vocab import load_vocab
        from edgecap.models.backbone import create_backbone
        from edgecap.runtimes import RuntimeStepModel, onnxruntime_session
        from edgecap.runtimes.onnxruntime_session import OnnxRuntimeSession
    assert OnnxRuntimeSession is new_session and onnxruntime_session is session and RuntimeStepModel is bridge_model
    assert create_backbone is importlib.import_module("edgecap.workshop.models.backbone").create_backbone
    assert load_vocab is importlib.import_module("edgecap.runtime.vocab").load_vocab


def test_submodules_map_by_the_longest_moved_prefix() -> None:
    assert new_module_name("edgecap.models.backbone") == "edgecap.workshop.models.backbone"
    assert new_module_name("edgecap.bundle.export") == "edgecap.workshop.export.bundle"
    assert new_module_name("edgecap.bundle.exporting.int8") == "edgecap.workshop.export.bundling.int8"
    assert new_module_name("edgecap.bundle.reader") == "edgecap.runtime.bundle.reader"
    assert new_module_name("edgecap.data.vocab") == "edgecap.runtime.vocab"
    assert new_module_name("edgecap.data.datasets") == "edgecap.workshop.data.datasets"
    assert new_module_name("edgecap.runtimes.tensorrt_engines") == "edgecap.runtime.backends.tensorrt.engines"
    assert new_module_name("edgecap.runtimes.registry") == "edgecap.runtime.backends.registry"


@pytest.mark.parametrize(
    "name",
    [
        "edgecap",
        "edgecap.runtime",
        "edgecap.runtime.backends",
        "edgecap.runtimesx",
        "edgecap.bench.run",
        "numpy",
        "edgecap_models",
        "edgecap.workshop.models",
        "xedgecap.models",
        "edgecap.modelsx.y",
    ],
)
def test_the_finder_ignores_modules_that_did_not_move(name: str) -> None:
    assert new_module_name(name) is None
    assert MovedModuleFinder().find_spec(name, None) is None


def test_an_old_child_name_never_replaces_a_new_parents_module(fresh_old_names: None) -> None:
    """``edgecap.runtimes.tensorrt`` is the TensorRT runtime module; ``backends.tensorrt`` stays the package."""
    import edgecap.runtime.backends
    import edgecap.runtime.backends.tensorrt

    package = edgecap.runtime.backends.tensorrt
    with pytest.warns(FutureWarning):
        from edgecap.runtimes.tensorrt import load_bundle_runtime
    runtime_module = importlib.import_module("edgecap.runtime.backends.tensorrt.runtime")
    assert load_bundle_runtime is runtime_module.load_bundle_runtime
    assert edgecap.runtime.backends.tensorrt is package
    assert sys.modules["edgecap.runtimes"] is edgecap.runtime.backends  # the stand-in went away


def test_the_finder_is_installed_once_and_first() -> None:
    assert install() is install()
    finders = [f for f in sys.meta_path if isinstance(f, MovedModuleFinder)]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]
    assert edgecap.__name__ == "edgecap"


def test_nothing_exists_at_the_old_paths() -> None:
    for old in MOVED:
        path = _module_path(old)
        assert not path.exists() and not path.with_suffix(".py").exists(), f"{old} is on disk again: {path}"


@pytest.mark.parametrize("new", sorted(set(MOVED.values())))
def test_every_new_path_is_a_module(new: str) -> None:
    path = _module_path(new)
    assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), new


def test_old_runtime_paths_stay_torch_free() -> None:
    """Old runtime-side paths (and old parents of them) import no torch; an old build-side path does, only then."""
    script = textwrap.dedent(
        """
        import sys, warnings
        warnings.simplefilter("ignore", FutureWarning)
        import edgecap.runtimes.onnxruntime_session, edgecap.runtimes.images, edgecap.bundle.reader
        import edgecap.data.vocab, edgecap.decoding, edgecap.captioner, edgecap.precisions, edgecap.engines
        assert "torch" not in sys.modules and "edgecap.workshop.export.bundle" not in sys.modules, "runtime"
        import edgecap.runtimes.torch
        assert "torch" in sys.modules, "build"
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_the_migration_doc_lists_the_table() -> None:
    text = (ROOT / "docs" / "migration.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|$", text, flags=re.MULTILINE)
    expected = "\n".join(f"| `{old}` | `{new}` |" for old, new in MOVED.items())
    assert rows == list(MOVED.items()), f"docs/migration.md's table should read:\n{expected}"
    assert importlib.util.find_spec("edgecap.runtime._moved") is not None
