"""``docs/extending.md`` runs as written: its ``file:`` blocks become modules, its ``run:`` blocks are executed in
order, and what they register then works through the public entry points."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import edgecap.workshop.export.calibration.presets as presets_module
import edgecap.workshop.models._registry as models_registry
from edgecap import Captioner
from edgecap.runtime.backends import registry as runtimes_registry
from tests.bench.conftest import tiny_bundle  # noqa: F401  (the session's tiny exported bundle)

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"<!-- (file: (?P<file>[\w.]+)|run) -->\n```python\n(?P<code>.*?)```", re.S)


def doc_blocks() -> list[tuple[str | None, str]]:
    """(file name or None for a ``run`` block, code), in document order."""
    return [(m.group("file"), m.group("code")) for m in BLOCK.finditer(DOC.read_text())]


@pytest.fixture
def isolated_registries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Private copies of every registry the examples write to (the runtimes' plugins loaded first, so they land in the
    real registry), and a folder on ``sys.path`` for their modules."""
    runtimes_registry.load_runtime_plugins()
    for module, name in (
        (models_registry, "_VARIANTS"),
        (models_registry, "_FAMILIES"),
        (runtimes_registry, "_REGISTRY"),
        (runtimes_registry, "_ALIASES"),
        (presets_module, "_PRESETS"),
    ):
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_family", "my_runtime"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_the_document_has_the_examples_this_test_runs() -> None:
    blocks = doc_blocks()
    assert [f for f, _ in blocks if f] == ["my_family.py", "my_runtime.py"]
    assert sum(f is None for f, _ in blocks) == 4


def test_every_example_runs_and_registers_what_it_says(
    isolated_registries: Path,
    tiny_bundle: Path,  # noqa: F811  (the fixture imported above)
) -> None:
    namespace: dict[str, object] = {}
    for filename, code in doc_blocks():
        if filename:
            (isolated_registries / filename).write_text(code)
        else:
            exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102  (the documentation's own examples)

    from edgecap.runtime.backends import list_runtimes
    from edgecap.workshop.export.calibration import list_presets
    from edgecap.workshop.models import list_families, list_models
    from edgecap.workshop.training.objectives import cross_entropy, objective_for

    assert "my-family" in list_families() and "my-family-test" in list_models()
    model = namespace["model"]
    assert objective_for(model) is cross_entropy and namespace["export_spec"].graph_names[-1] == "step"
    assert "onnxruntime-cpu1" in list_runtimes() and "cpu-avx2-tensorwise" in list_presets()

    features = {
        "features": np.random.default_rng(0).standard_normal((1, 4, 24)).astype(np.float32),
        "boxes": np.tile(np.array([0.2, 0.2, 0.7, 0.7], np.float32), (1, 4, 1)),
        "feature_mask": np.ones((1, 4), dtype=bool),
    }
    with Captioner.load(tiny_bundle, runtime="onnxruntime-cpu1", precision="fp32") as cap:
        assert cap.runtime_info["provider_reason"].startswith("onnxruntime-cpu1")
        assert len(cap.caption_inputs(features)) == 1
