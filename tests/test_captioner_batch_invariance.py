"""A caption never depends on which other images share its batch: ``Captioner.batch`` gives every image the caption a
call with that image alone gives, for every precision of a bundle, the INT8 default preset and a ``dynamic`` INT8
step (whose activations ONNX Runtime quantises with one scale per call, so it is decoded image by image)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from edgecap import Captioner
from edgecap.runtime.bundle import load_bundle
from edgecap.workshop.export.bundle import export_bundle
from tests.runtime.bundle.helpers import export_result_from, pixel_run

pytest.importorskip("onnxruntime")

_BUNDLES: dict[str, Path] = {}


@pytest.fixture(scope="module")
def bundles(tiny_data, tmp_path_factory) -> dict[str, Path]:
    """``default``: FP32 + FP16 + INT8 with this machine's preset; ``dynamic``: the same FP32 graphs (not exported
    again) with an INT8 variant whose step is ``dynamic``."""
    if not _BUNDLES:
        import edgecap.workshop.export

        data, _ = tiny_data
        run, weights = pixel_run(tiny_data, tmp_path_factory)
        root = tmp_path_factory.mktemp("batch-invariance")
        common = {"int8": True, "calib": data, "calib_size": 8, "quality_images": 0, "progress": False}
        torch.set_flush_denormal(True)  # random EfficientNet weights
        try:
            default = export_bundle(run, root / "default", fp16=True, backbone_weights=weights, **common)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(
                    edgecap.workshop.export,
                    "export_onnx",
                    lambda model, *a, **k: export_result_from(default, model, ("fp32",), backbone=k.get("backbone")),
                )
                dynamic = export_bundle(run, root / "dynamic", backbone_weights=weights, int8_step="dynamic", **common)
        finally:
            torch.set_flush_denormal(False)
        _BUNDLES.update(default=default, dynamic=dynamic)
    return _BUNDLES


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())


@pytest.mark.parametrize(
    ("bundle", "precision", "step"),
    [
        ("default", "fp32", None),
        ("default", "fp16", None),
        ("default", "int8", "static"),
        ("dynamic", "int8", "dynamic"),
    ],
)
@pytest.mark.parametrize("beam", [3, 1])
def test_batch_gives_every_image_its_one_by_one_caption(bundles, images, bundle, precision, step, beam):
    path = bundles[bundle]
    if step is not None:
        assert load_bundle(path, graphs="none").int8_schemes()["step"]["scheme"] == step
    with Captioner.load(path, runtime="onnxruntime", precision=precision, beam=beam, threads=1) as cap:
        assert cap.runtime_info["per_image_decode"] is (step == "dynamic")
        alone = [cap(image) for image in images]
        # varied captions, so a batch-dependent step would change some (the tiny random-ish model gives 7 distinct
        # INT8 beam-3 captions of 40 on an AVX2-only CPU, 8+ with VNNI: the bar is variety, not a count per CPU)
        assert len(set(alone)) >= len(images) // 8
        assert cap.batch(images) == alone
        assert cap.batch(images[::-1], batch_size=7) == alone[::-1]
