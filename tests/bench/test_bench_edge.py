"""``edgecap bench`` on pixels-in bundles: the same run's bundle with its backbone in torch as a subject of the same
report (the end-to-end comparison, pixels-in vs the torch backbone), and the bench library run where no [train]-only
package can be imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgecap.bench.report import load_report, write_report
from edgecap.bench.run import BenchCfg, run_benchmark
from tests.runtime.bundle.helpers import pixel_run

ROOT = Path(__file__).resolve().parents[2]
FAST = {"warmup": 1, "min_repeats": 2, "min_seconds": 0.0, "threads": 1, "isolate": False, "quality": False}

#: A ``sitecustomize`` that makes the training stack unimportable, in this interpreter and every child it starts.
BLOCKER = textwrap.dedent(
    """
    import importlib.abc
    import sys

    BLOCKED = {
        "torch", "torchvision", "timm", "onnx", "onnxscript", "matplotlib", "pycocoevalcap", "safetensors", "tqdm",
        "rich",
    }


    class _Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: runtime-only test)", name=name)
            return None


    sys.meta_path.insert(0, _Blocked())
    """
)


@pytest.fixture(scope="module")
def twins(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(pixels-in bundle, torch-backbone bundle, images): one pixel run exported with its backbone in the encoder
    graph and with it in torch (FP32), and a few of the dataset's images."""
    from edgecap.workshop.export.bundle import export_bundle

    run, weights = pixel_run(tiny_data, tmp_path_factory)
    root = tmp_path_factory.mktemp("twins")
    options = {"backbone_weights": weights, "progress": False, "quality_images": 0}
    pixels = export_bundle(run, root / "pixels", with_backbone=True, **options)
    eager = export_bundle(run, root / "eager", with_backbone=False, **options)
    images = root / "images"
    images.mkdir()
    for image in sorted((tiny_data[0] / "images").iterdir())[:3]:
        (images / image.name).write_bytes(image.read_bytes())
    return Path(pixels), Path(eager), images


def test_pixels_in_and_torch_backbone_bundles_in_one_report(twins: tuple[Path, Path, Path], tmp_path: Path) -> None:
    pixels, eager, images = twins
    cfg = BenchCfg(bundles=(pixels, eager), runtimes=("onnxruntime",), batches=(1,), beams=(3,), images=images, **FAST)
    report = run_benchmark(cfg, progress=False)
    assert not report.errors, report.errors
    where = {Path(r.bundle).name: r.backbone for r in report.results}
    assert where == {"pixels": "graph", "eager": "torch"}
    assert len({b.run for b in report.bundles}) == 1  # the same run behind both
    eager_result = next(r for r in report.results if r.backbone == "torch")
    assert eager_result.breakdown.backbone_ms is not None and eager_result.size.backbone_parameters
    text = write_report(report, tmp_path / "r", plots=False)["markdown"].read_text()
    assert "| pixels-in vs torch backbone |" in text
    assert "onnxruntime fp32 pixels-in / onnxruntime fp32 + torch backbone" in text


def test_a_pixels_in_bundle_alone_says_how_to_get_the_comparison(twins: tuple[Path, Path, Path]) -> None:
    pixels, _, images = twins
    cfg = BenchCfg(bundles=(pixels,), runtimes=("onnxruntime",), batches=(1,), beams=(1,), images=images, **FAST)
    report = run_benchmark(cfg, progress=False)
    assert any("torch-backbone bundle of the same run" in note for note in report.notes)


def test_bench_runs_from_pixels_without_the_training_stack(
    twins: tuple[Path, Path, Path], tiny_data: tuple[Path, Path], tmp_path: Path
) -> None:
    """``run_benchmark`` + ``write_report`` with torch, timm, matplotlib and pycocoevalcap unimportable (here and in
    the isolated worker): ORT is measured from pixels with CIDEr-D, torch runtimes are skipped with the install hint,
    and the plots are skipped with a note."""
    pixels, _, images = twins
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    script = textwrap.dedent(
        f"""
        import json, sys
        from edgecap.bench.report import write_report
        from edgecap.bench.run import BenchCfg, run_benchmark

        cfg = BenchCfg(
            bundles=({str(pixels)!r},), runtimes=("onnxruntime", "torch", "torch-rerun"), batches=(1,), beams=(3,),
            images={str(images)!r}, quality_data={str(tiny_data[0])!r}, quality_images=4,
            warmup=1, min_repeats=2, min_seconds=0.0, threads=1,
        )
        report = run_benchmark(cfg, progress=False)
        write_report(report, {str(tmp_path / "out")!r})
        print(json.dumps({{"torch": "torch" in sys.modules, "matplotlib": "matplotlib" in sys.modules}}))
        """
    )
    env = {"PYTHONPATH": f"{site}:{ROOT}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": False, "matplotlib": False}
    report = load_report(tmp_path / "out")
    assert not report.errors, report.errors
    [result] = report.results
    assert (result.runtime, result.backbone, result.input) == ("onnxruntime", "graph", "pixels")
    assert result.quality is not None and result.quality.metric == "CIDEr-D"
    skipped = {s.runtime: s.reason for s in report.skipped}
    assert set(skipped) == {"torch", "torch-rerun"}
    assert all("pip install 'edgecap[train]'" in reason for reason in skipped.values())
    assert any("need matplotlib" in note for note in report.notes)
    assert not list((tmp_path / "out").glob("*.png")) and (tmp_path / "out" / "report.md").is_file()


def test_a_runtime_not_installed_is_skipped_with_the_registrys_hint(
    twins: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgecap.bench.subjects import skip_reason
    from edgecap.runtime.backends import registry
    from edgecap.runtime.bundle import load_bundle

    real = registry._find_spec
    monkeypatch.setattr(registry, "_find_spec", lambda module: None if module == "torch" else real(module))
    bundle = load_bundle(twins[0], verify=False, graphs="none")
    for runtime in ("torch", "torch-rerun"):
        reason = skip_reason(runtime, "fp32", bundle, None)
        assert reason is not None and "torch" in reason and "pip install 'edgecap[train]'" in reason
    assert skip_reason("onnxruntime", "fp32", bundle, None) is None
    assert "unknown runtime 'trt'" in (skip_reason("trt", "fp32", bundle, None) or "")
    from edgecap.bench import environment

    monkeypatch.setattr(environment, "module_installed", lambda module: module not in ("torch", "timm"))
    assert skip_reason("onnxruntime", "fp32", bundle, None) is None  # pixels-in: ONNX Runtime alone
    eager = load_bundle(twins[1], verify=False, graphs="none")
    reason = skip_reason("onnxruntime", "fp32", eager, None) or ""
    assert "runs its backbone" in reason and "pip install 'edgecap[train]'" in reason


def test_bench_modules_import_nothing_from_the_build_half() -> None:
    """Statically, like ``tests/test_import_graph.py`` for the front ends: the module-level imports of every bench
    module (library, report readers, CLI) reach neither ``edgecap.workshop`` nor a [train]-only package; torch,
    matplotlib and the evaluation code are imported inside the functions that need them."""
    import ast

    from tests import test_import_graph as graph

    entries = [f"edgecap.bench.{m.stem}" for m in (ROOT / "edgecap" / "bench").glob("*.py") if m.stem != "__init__"]
    reached: dict[str, str] = {}
    todo = [(name, "") for name in ("edgecap.bench", *entries, "edgecap.cli.bench")]
    while todo:
        name, parent = todo.pop()
        if name in reached:
            continue
        reached[name] = parent
        if name not in graph.MODULES:
            continue
        tree = ast.parse(graph.MODULES[name].read_text(encoding="utf-8"))
        for node in tree.body:  # module level only; a TYPE_CHECKING block is not an import at run time
            if isinstance(node, ast.ImportFrom) and node.module:
                todo.append((node.module, name))
                todo.extend((f"{node.module}.{a.name}", name) for a in node.names)
            elif isinstance(node, ast.Import):
                todo.extend((a.name, name) for a in node.names)
        todo.extend((".".join(name.split(".")[:i]), name) for i in range(1, name.count(".") + 1))
    bad = {
        module: parent
        for module, parent in reached.items()
        if module.startswith("edgecap.workshop") or module.split(".")[0] in graph.TRAIN_ONLY
    }
    assert "edgecap.bench.worker" in reached and "edgecap.runtime" in reached
    assert not bad, f"bench imports reach the workshop half or [train]-only packages: {bad}"
