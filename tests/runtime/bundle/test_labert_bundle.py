"""LaBERT bundles: ``edgecap export`` of a LaBERT run, ``load_bundle``'s ``refine`` role check, ``Captioner.load``
with mask-predict at a length level (torch vs ONNX Runtime), and the default level of length-aware bundles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgecap import Captioner
from edgecap.runtime.bundle import BundleError, BundleIntegrityError, load_bundle
from edgecap.runtime.bundle.manifest import MANIFEST_NAME
from edgecap.runtime.bundle.reader import Bundle, BundleConfigError
from edgecap.runtime.captioner import CaptionerError, bundle_decode_cfg
from edgecap.runtime.captioning import DEFAULT_LENGTH_LEVEL
from edgecap.workshop.models import LengthLevelError
from tests.runtime.bundle.helpers import copy_bundle, edit_json, export_result_from, labert_bundle, pixel_run, rehash

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def labert(tiny_data, tmp_path_factory) -> tuple[Path, str, Path, Path]:
    """(LaBERT bundle, the export command's output, its run, the run's backbone weights)."""
    bundle, output = labert_bundle(tiny_data, tmp_path_factory)
    run, weights = pixel_run(tiny_data, tmp_path_factory, "labert-test")
    return bundle, output, run, weights


@pytest.fixture(scope="module")
def images(tiny_data) -> list[Path]:
    return sorted((tiny_data[0] / "images").iterdir())[:4]


def test_cli_export_records_mask_predict_and_the_length_plan(labert):
    bundle, output, _, _ = labert
    opened = load_bundle(bundle)  # verifies checksums and every graph against the interface
    interface = opened.interface
    assert interface["decoding"] == "mask_predict" == opened.decoding
    assert interface["runtime_graphs"] == {"encoder": "encoder", "refine": "refine"}
    length = interface["length"]
    assert length["levels"] == [[1, 9], [10, 14], [15, 19], [20, 25]]
    assert length["default_level"] == DEFAULT_LENGTH_LEVEL == opened.default_length_level
    assert len(length["refine_steps"]) == len(length["eos_decay"]) == 4
    quality = opened.quality("fp32")
    assert quality["decoding"] == "mask_predict" and quality["length_level"] == DEFAULT_LENGTH_LEVEL
    assert quality["agreement"] == 1.0  # FP32 ONNX Runtime mask-predict == torch mask-predict on the held-out set
    assert f"bundle written to {bundle}" in output


def test_onnxruntime_bundle_captions_equal_torch_mask_predict_at_every_level(labert, images):
    bundle, _, run, weights = labert
    reference = Captioner.from_run(run, backbone_weights=weights)
    with (
        Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap,
        Captioner.load(bundle, runtime="torch") as tc,
    ):
        assert cap.runtime_info["decoding"] == "mask_predict" and tc.runtime_info["precision"] == "fp32"
        for level in (1, 2, 4):
            expected = reference.batch(images, length_level=level)
            assert all(expected)  # non-empty captions: the comparison means something
            assert cap.batch(images, length_level=level) == expected == tc.batch(images, length_level=level)
        assert cap(images[0]) == cap(images[0], length_level=DEFAULT_LENGTH_LEVEL)
        assert cap.runtime_info["length_level"] == DEFAULT_LENGTH_LEVEL
        assert f"mask-predict at length level {DEFAULT_LENGTH_LEVEL}" in cap.runtime_info["summary"]


def test_bad_levels_and_torch_fp16_are_refused_clearly(labert, images):
    bundle, _, _, _ = labert
    with Captioner.load(bundle, runtime="onnxruntime", precision="fp32") as cap:
        with pytest.raises(LengthLevelError, match=r"1\.\.4"):
            cap(images[0], length_level=5)
        with pytest.raises(LengthLevelError):
            cap.batch(images, length_level=0)
    with pytest.raises(CaptionerError, match="FP32"):
        Captioner.load(bundle, runtime="torch", precision="fp16", device="cpu")


def test_int8_uses_the_refine_calibration_and_decodes_by_mask_predict(labert, images, tiny_data, tmp_path, monkeypatch):
    """Re-export with INT8 (the ONNX export stands in from the bundle's graphs: the INT8 path is under test)."""
    import edgecap.workshop.export
    from edgecap.workshop.export.bundle import export_bundle

    bundle = labert[0]
    stand_in = lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), k["backbone"], name="labert-test")  # noqa: E731
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)
    out = export_bundle(bundle, tmp_path / "int8", int8=True, calib=tiny_data[0], calib_size=4, progress=False)
    opened = load_bundle(out)
    int8 = opened.variant("int8")
    roles = {"encoder", "refine"}
    assert set(int8["files"]) == roles and set(int8["artefacts"]) == {"ranges"}
    assert set(json.loads((out / int8["artefacts"]["ranges"]).read_text())["ranges"]) == roles
    assert int8["quality"]["decoding"] == "mask_predict" and int8["quality"]["images"] > 0
    with Captioner.load(out, runtime="onnxruntime", precision="int8") as cap:
        assert cap.runtime_info["precision"] == "int8"
        assert all(len(c.split()) <= 9 for c in cap.batch(images[:2], length_level=1))


def test_a_refine_graph_of_another_interface_is_refused(labert, tmp_path):
    bundle = copy_bundle(labert[0], tmp_path / "swapped")
    files = load_bundle(bundle).variant("fp32")["files"]
    shutil.copyfile(bundle / files["encoder"], bundle / files["refine"])
    with pytest.raises(BundleIntegrityError, match="refine"):
        load_bundle(bundle)  # the checksum catches it first
    rehash(bundle)
    with pytest.raises(BundleConfigError, match=r"refine graph does not match.*length_level"):
        load_bundle(bundle)


def test_a_manifest_whose_roles_do_not_fit_its_decoding_is_refused(labert, tmp_path):
    bundle = copy_bundle(labert[0], tmp_path / "roles")
    edit_json(bundle / MANIFEST_NAME, interface__decoding="autoregressive")
    with pytest.raises(BundleError, match=r"\['refine'\] have no meaning for autoregressive decoding"):
        load_bundle(bundle, verify=False)
    edit_json(bundle / MANIFEST_NAME, interface__decoding="diffusion")
    with pytest.raises(BundleError, match="'diffusion' is unknown"):
        load_bundle(bundle, verify=False)


def _bundle(interface: dict) -> Bundle:
    base = {"decode_inputs": ["features", "boxes", "feature_mask"], "state_names": [], "runtime_graphs": {}}
    return Bundle(Path("b"), {"interface": {**base, **interface}}, {"decode": {"max_words": 8, "beam": 3}})


def test_length_aware_bundles_decode_at_a_default_level_without_one():
    vocab = SimpleNamespace(kind="word", tokens_per_word=1, pad_id=0, bos_id=1, eos_id=2, unk_id=3, size=10)
    recorded = _bundle({"length": {"levels": [[1, 9], [10, 14], [15, 19]], "default_level": 3}})
    assert bundle_decode_cfg(recorded, vocab, beam=3).length_level == 3
    assert bundle_decode_cfg(recorded, vocab, beam=3, length_level=1).length_level == 1
    older = _bundle({"decode_inputs": ["features", "boxes", "feature_mask", "length_level"]})  # no length record
    assert older.default_length_level == DEFAULT_LENGTH_LEVEL
    assert bundle_decode_cfg(older, vocab, beam=1).length_level == DEFAULT_LENGTH_LEVEL
    plain = _bundle({})
    assert plain.default_length_level is None and bundle_decode_cfg(plain, vocab, beam=3).length_level is None
    assert json.dumps(plain.length_levels) == "[]"


def test_accuracy_aware_int8_ranks_and_keeps_layers_of_the_mask_predict_graphs(
    labert, images, tiny_data, tmp_path, monkeypatch
):
    """The selection runs on ``encoder`` + ``refine``: the first check (full INT8) is made to miss, so the layers are
    ranked by leave-one-out mask-predict decoding and the first one goes back to float."""
    import edgecap.workshop.export
    from edgecap.workshop.export.bundle import export_bundle
    from edgecap.workshop.export.calibration.sensitivity import Int8Target

    bundle = labert[0]
    stand_in = lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), k["backbone"], name="labert-test")  # noqa: E731
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)
    first: list[int] = []

    def shortfalls(self, quality):
        first.append(first[0] if first else id(quality))
        return ["the full INT8 graphs miss"] if id(quality) == first[0] else []

    monkeypatch.setattr(Int8Target, "shortfalls", shortfalls)
    out = export_bundle(
        bundle,
        tmp_path / "int8",
        int8=True,
        calib=tiny_data[0],
        calib_size=4,
        progress=False,
        min_agreement=0.9,
        ranking_images=2,
    )
    selection = load_bundle(out).variant("int8")["selection"]
    assert [k.split(":")[0] in ("encoder", "refine") for k in (e["layer"] for e in selection["kept_float"])] == [True]
    assert selection["ranking"]["images"] == 2 and selection["latency"]["selected"]["step_ms"] > 0
    with Captioner.load(out, runtime="onnxruntime", precision="int8") as cap:
        assert all(cap.batch(images[:2]))
