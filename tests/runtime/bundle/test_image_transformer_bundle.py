"""An Image Transformer run through the whole deployment path: a trained tiny region run exported to a bundle in
FP32, FP16 and INT8 (calibrated through the shared path, each variant checked on the task), captioned by torch and
ONNX Runtime with identical FP32 captions, and measured by ``edgecap bench``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.bench.report import load_report
from edgecap.cli.bench import bench
from tests.runtime.bundle.helpers import train_region_run

pytestmark = pytest.mark.usefixtures("flush_denormals")
FAST = ["--warmup", "1", "--min-repeats", "2", "--min-seconds", "0", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def it_bundle(tiny_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgecap.workshop.export.bundle import export_bundle

    root = tmp_path_factory.mktemp("it-bundle")
    run = train_region_run("image-transformer-test", tiny_data, root / "run")
    return export_bundle(run, root / "bundle", fp16=True, int8=True, calib=tiny_data[0], calib_size=8, progress=False)


def test_bundle_has_every_precision_checked(it_bundle: Path) -> None:
    manifest = json.loads((it_bundle / "manifest.json").read_text())
    assert set(manifest["variants"]) == {"fp32", "fp16", "int8"}
    assert manifest["model"]["family"] == "image_transformer"
    for precision, variant in manifest["variants"].items():
        assert variant["files"] == {"encoder": f"onnx/{precision}/init.onnx", "step": f"onnx/{precision}/step.onnx"}
        assert variant["quality"]["images"] > 0  # the task check against torch FP32 on held-out images
    for precision in ("fp32", "fp16"):
        assert all(graph["passed"] for graph in manifest["variants"][precision]["parity"].values())


def test_torch_and_onnxruntime_captions_are_identical_at_fp32(it_bundle: Path) -> None:
    import numpy as np

    from edgecap.runtime.captioner import Captioner

    rng = np.random.default_rng(0)
    corner = rng.uniform(0, 0.6, (4, 6, 2)).astype(np.float32)
    inputs = {
        "features": rng.standard_normal((4, 6, 24)).astype(np.float32),
        "boxes": np.concatenate((corner, corner + 0.3), -1),
        "feature_mask": np.ones((4, 6), dtype=bool),
    }
    captions = {}
    for runtime in ("torch", "onnxruntime"):
        with Captioner.load(it_bundle, runtime=runtime, precision="fp32", beam=3) as cap:
            captions[runtime] = cap.caption_inputs(inputs)
    assert len(captions["torch"]) == 4 and any(captions["torch"])
    assert captions["torch"] == captions["onnxruntime"]


def test_bench_measures_the_bundle(it_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["--bundle", str(it_bundle), "--runtime", "torch,onnxruntime", "--precision", "fp32,fp16,int8"]
    args += ["--batch", "1", "--beam", "2", "--synthetic", "3", "--no-isolate", "--out", str(out), *FAST]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    report = load_report(out / "report.json")
    assert not report.errors
    measured = {(r.runtime, r.precision) for r in report.results}
    assert {("torch", "fp32"), ("onnxruntime", "fp32"), ("onnxruntime", "fp16"), ("onnxruntime", "int8")} <= measured
