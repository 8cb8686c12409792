"""Bundles written before the TensorRT calibration tables were dropped still verify and run: they list
``calibration/*.trt_calibration.cache`` files (and ``artefacts.tensorrt_caches``) that nothing reads any more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgecap import Captioner
from edgecap.runtime.bundle import load_bundle
from edgecap.runtime.bundle.manifest import MANIFEST_NAME, BundleIntegrityError
from tests.runtime.bundle.helpers import copy_bundle, pixel_bundle, rehash


def test_a_bundle_with_old_calibration_tables_still_loads(tiny_data, tmp_path_factory, tmp_path: Path) -> None:
    bundle = copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "old")
    tables = {}
    for graph in ("init", "step"):
        tables[graph] = f"calibration/{graph}.trt_calibration.cache"
        (bundle / tables[graph]).parent.mkdir(exist_ok=True)
        (bundle / tables[graph]).write_text("TRT-100300-EntropyCalibration2\nmemory: 3c010204\n")
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    manifest["variants"]["fp32"]["artefacts"] = {"tensorrt_caches": tables}
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))
    rehash(bundle)
    opened = load_bundle(bundle)  # every listed file verified, the old tables included
    assert opened.variant("fp32")["artefacts"]["tensorrt_caches"] == tables
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap:
        assert isinstance(cap(sorted((tiny_data[0] / "images").iterdir())[0]), str)


def test_an_engines_folder_is_outside_the_checksums(tiny_data, tmp_path_factory, tmp_path: Path) -> None:
    bundle = copy_bundle(pixel_bundle(tiny_data, tmp_path_factory)[0], tmp_path / "with-engines")
    (bundle / "engines" / "fp16-b1-k3-0123456789abcdef").mkdir(parents=True)
    (bundle / "engines" / "fp16-b1-k3-0123456789abcdef" / "step.plan").write_bytes(b"plan")
    load_bundle(bundle)  # no "not listed in manifest.json" for derived engines
    (bundle / "extra.txt").write_text("added")
    with pytest.raises(BundleIntegrityError, match="extra.txt: not listed") as err:  # anything else still fails
        load_bundle(bundle)
    assert "step.plan" not in str(err.value)
