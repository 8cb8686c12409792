"""``export_bundle``: what the manifest records is measured, failures leave nothing, bad inputs are named.

The real FP32+FP16+INT8 export runs once (``region_bundle``); tests of what happens around ``export_onnx`` (an
interrupted or failed export) stand in for it with an ``ExportResult`` rebuilt from that bundle's own graphs.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import edgecap.workshop.export
import edgecap.workshop.export.bundling.quality as export_quality
from edgecap.runtime.bundle import load_bundle
from edgecap.workshop.export.bundle import BundleExportError, calibration_images, export_bundle
from edgecap.workshop.runs import load_run
from edgecap.workshop.training.checkpoint import RunError
from tests.runtime.bundle.helpers import (
    edit_json,
    export_result_from,
    pixel_bundle,
    pixel_run,
    region_bundle,
    region_run,
)


@pytest.fixture(scope="module")
def bundle(tiny_data, tmp_path_factory) -> Path:
    return region_bundle(tiny_data, tmp_path_factory)


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory) -> Path:
    return region_run(tiny_data, tmp_path_factory)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_manifest_records_versions_parity_and_files(bundle: Path):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["versions"]["torch"] == importlib.metadata.version("torch")
    assert manifest["versions"]["onnx"] and manifest["versions"]["onnxruntime"] and manifest["opset"] >= 17
    assert set(manifest["files"]) >= {"config.json", "vocab.json", "weights.safetensors", "onnx/int8/step.onnx"}
    for precision in ("fp32", "fp16"):
        variant = manifest["variants"][precision]
        assert set(variant["parity"]) == {"encoder", "start", "init", "step"}
        for report in variant["parity"].values():
            assert report["passed"] and report["feeds"] >= 2
            for out in report["outputs"].values():
                assert 0 <= out["max_abs"] <= out["atol"] + out["rtol"] * 100 and out["violations"] == 0
    config = json.loads((bundle / "config.json").read_text())
    assert config["model"]["name"] == "ort-test" and config["model"]["family"] == "ort"
    assert config["vocab"]["kind"] == "word" and config["decode"] == {"max_words": 12, "beam": 3}


def test_int8_quality_is_measured_on_the_val_split(bundle: Path, run: Path, tiny_data):
    """The INT8 numbers are recomputed here, independently, from the bundle's graphs and the run's torch weights."""
    from edgecap.runtime.backends.onnxruntime.step import create_onnxruntime_step_model
    from edgecap.runtime.captioning import decode_cfg_for
    from edgecap.runtime.decoding import decode
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.evaluation import cider_d
    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.training.batches import FeatureBank

    loaded = load_bundle(bundle)
    quality = loaded.quality("int8")
    data, feats = tiny_data
    val = load_dataset(data).split("val")
    assert quality["images"] == len(val) == 4 and quality["set"].startswith("val split of dataset")
    assert quality["reference"] == "torch FP32" and quality["references"] == "human captions"
    assert loaded.manifest["held_out"]["images"] == 4

    trained = load_run(run)
    bank = FeatureBank(open_feature_source(feats), [r.image_id for r in val])
    torch_caps = caption_bank(trained.model, bank, trained.vocab, beam_size=3, max_words=12)
    cfg = decode_cfg_for(trained.vocab, beam_size=3, max_words=12)
    with create_onnxruntime_step_model(loaded.graph_path("int8", "encoder"), loaded.graph_path("int8", "step")) as sm:
        hyps = decode(sm, bank.batch(list(range(len(val)))).as_inputs(), cfg)
    int8_caps = [" ".join(trained.vocab.decode(h[0].tokens)) for h in hyps]
    refs = {i: [" ".join(c) for c in r.captions] for i, r in enumerate(val)}
    assert quality["agreement"] == pytest.approx(np.mean([a == b for a, b in zip(torch_caps, int8_caps, strict=True)]))
    assert quality["reference_cider_d"] == pytest.approx(cider_d(dict(enumerate(torch_caps)), refs))
    assert quality["candidate_cider_d"] == pytest.approx(cider_d(dict(enumerate(int8_caps)), refs))
    assert quality["cider_d_delta"] == pytest.approx(quality["candidate_cider_d"] - quality["reference_cider_d"])
    assert loaded.quality("fp32")["agreement"] == 1.0  # the decode-level parity promise, measured at export


def test_int8_calibration_artefacts(bundle: Path, tiny_data):
    loaded = load_bundle(bundle)
    int8 = loaded.variant("int8")
    assert int8["target"] == "cpu-auto" and int8["preset"] in ("cpu-avx2", "cpu-vnni", "arm64")
    assert int8["calibration"]["images"] == 8 and int8["calibration"]["set"].startswith("train split of dataset")
    ranges = json.loads((bundle / int8["artefacts"]["ranges"]).read_text())
    assert ranges["preset"] == int8["preset"] and set(ranges["ranges"]) == {"encoder", "step"}
    calibrated = [role for role, record in int8["schemes"].items() if record["scheme"] == "static"]
    assert calibrated and all(bool(ranges["ranges"][role]) == (role in calibrated) for role in ranges["ranges"])
    lo, hi = next(iter(ranges["ranges"][calibrated[0]].values()))  # dynamic/weight-only roles have no ranges
    assert lo <= hi
    assert set(int8["artefacts"]) == {"ranges"}  # no TensorRT calibration table: engines build from the QDQ graphs
    assert not list(bundle.glob("calibration/*.cache"))


def test_an_interrupted_export_leaves_no_half_written_bundle(run: Path, bundle: Path, tmp_path: Path, monkeypatch):
    def export_onnx(model, out_dir=None, **kwargs):
        return export_result_from(bundle, model, precisions=("fp32",))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C after the graphs, config, vocab and weights were written

    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", export_onnx)
    monkeypatch.setattr(export_quality, "task_check", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_bundle(run, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_a_failed_parity_check_fails_the_export_and_leaves_nothing(run: Path, bundle: Path, tmp_path, monkeypatch):
    monkeypatch.setattr(
        edgecap.workshop.export,
        "export_onnx",
        lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), fail="step"),
    )
    with pytest.raises(BundleExportError) as err:
        export_bundle(run, tmp_path / "out", progress=False)
    assert "parity check failed" in str(err.value) and "step (fp32)" in str(err.value) and "0.5" in str(err.value)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_a_bundle_can_be_exported_again_from_its_own_weights(bundle: Path, tmp_path: Path, monkeypatch):
    from edgecap.runtime.bundle.manifest import sha256_file

    stand_in = lambda model, *a, **k: export_result_from(bundle, model, ("fp32",))  # noqa: E731
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)
    out = export_bundle(bundle, tmp_path / "again", progress=False)
    again, original = load_bundle(out), load_bundle(bundle)
    assert again.precisions == ("fp32",) and again.config["source"]["origin"] == f"bundle {bundle}"
    assert again.config["source"]["weights_sha256"] == original.config["source"]["weights_sha256"]
    assert sha256_file(out / "weights.safetensors") == sha256_file(bundle / "weights.safetensors")
    assert again.quality("fp32")["agreement"] == 1.0 and again.quality("fp32")["images"] == 4


def test_int8_without_a_dataset_holds_out_calibration_images(tiny_data, tmp_path_factory, tmp_path, monkeypatch):
    """A run whose dataset is gone: INT8 is judged on calibration images kept out of calibration, scored against
    the FP32 captions; an unreadable file in the folder is skipped and counted."""
    torch.set_flush_denormal(True)  # random EfficientNet weights
    try:
        pixels, _ = pixel_bundle(tiny_data, tmp_path_factory)
        run, weights = pixel_run(tiny_data, tmp_path_factory)
        moved = Path(shutil.copytree(run, tmp_path / "run"))
        edit_json(moved / "config.json", data=None)
        calib = tmp_path / "calib"
        calib.mkdir()
        for image in sorted((tiny_data[0] / "images").iterdir())[:9]:
            shutil.copy(image, calib / image.name)
        (calib / "000004x.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
        stand_in = lambda model, *a, **k: export_result_from(pixels, model, ("fp32",), backbone=k["backbone"])  # noqa: E731
        monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)
        out = export_bundle(moved, tmp_path / "b", int8=True, calib=calib, backbone_weights=weights, progress=False)
    finally:
        torch.set_flush_denormal(False)
    loaded = load_bundle(out)
    held_out = loaded.manifest["held_out"]
    assert held_out["images"] == 2 and "kept out of calibration" in held_out["set"]
    calibration = loaded.variant("int8")["calibration"]
    assert calibration["images"] == 7 and calibration["skipped"] == 1
    assert "000004x.jpg" in next(iter(calibration["skipped_examples"]))
    quality = loaded.quality("int8")
    assert quality["references"] == "torch FP32 captions" and quality["images"] == 2
    assert loaded.quality("fp32")["agreement"] == 1.0 and 0.0 <= quality["agreement"] <= 1.0
    # pixels in by default, and INT8 reaches into the backbone: its convolutions read dequantised weights and inputs
    assert loaded.backbone_in_graph and loaded.decode_inputs == ("pixel_values",)
    encoder = onnx.load(str(loaded.graph_path("int8", "encoder")))
    producers = {o: n.op_type for n in encoder.graph.node for o in n.output}
    convs = [n for n in encoder.graph.node if n.op_type == "Conv"]
    quantised = [n for n in convs if producers.get(n.input[0]) == producers.get(n.input[1]) == "DequantizeLinear"]
    assert convs and len(quantised) == len(convs)


def test_an_empty_calibration_set_is_a_clear_error(run: Path, tmp_path: Path):
    empty = tmp_path / "calib"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images here")
    with pytest.raises(BundleExportError, match="calibration set is empty"):
        export_bundle(run, tmp_path / "out", int8=True, calib=empty, progress=False)
    assert not (tmp_path / "out").exists()


def test_calibration_images_from_a_folder_or_a_dataset(tiny_data, tmp_path: Path):
    data, _ = tiny_data
    images, description = calibration_images(data)
    assert len(images) == 32 and description.startswith("train split") and images[0].image_id.isdigit()
    folder = tmp_path / "calib" / "nested"
    folder.mkdir(parents=True)
    for image in images[:3]:
        (folder / image.path.name).write_bytes(image.path.read_bytes())
    (folder / "README.md").write_text("not an image")
    found, description = calibration_images(tmp_path / "calib")
    assert [i.path.name for i in found] == sorted(i.path.name for i in images[:3]) and "images in" in description
    with pytest.raises(FileNotFoundError):
        calibration_images(tmp_path / "missing")


def test_unreadable_calibration_images_are_skipped_and_counted(tiny_data, tmp_path: Path):
    from edgecap.workshop.export.bundling.images import InputMaker
    from edgecap.workshop.models.backbone import create_backbone

    images, _ = calibration_images(tiny_data[0])
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    torch.manual_seed(0)
    backbone = create_backbone("test_efficientnet", pretrained=False, image_size=64)
    maker = InputMaker(source=None, backbone=backbone, with_backbone=True)
    inputs = maker.images([images[0].path, bad, images[1].path])
    assert len(inputs) == 2 and list(inputs.skipped) == [str(bad)] and "broken.jpg" in inputs.skipped[str(bad)]
    assert inputs.batches[0]["pixel_values"].shape == (2, 3, 64, 64)


def test_arguments_are_checked_before_any_work(run: Path, bundle: Path, tmp_path: Path):
    with pytest.raises(BundleExportError, match="needs calibration images"):
        export_bundle(run, tmp_path / "out", int8=True)
    with pytest.raises(BundleExportError, match="only used for INT8"):
        export_bundle(run, tmp_path / "out", calib=tmp_path)
    with pytest.raises(BundleExportError, match="unknown INT8 target 'gpu'"):
        export_bundle(run, tmp_path / "out", int8=True, calib=tmp_path, target="gpu")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_bundle(run, bundle)
    with pytest.raises(BundleExportError, match="region features"):
        export_bundle(run, tmp_path / "out", with_backbone=True)


def test_a_bare_model_name_resolves_under_edgecap_home(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EDGECAP_HOME", str(tmp_path / "home"))
    with pytest.raises(RunError) as err:
        export_bundle("acort-nothing", tmp_path / "out")
    message = str(err.value)
    assert str(tmp_path / "home" / "runs" / "acort-nothing" / "config.json") in message
    assert "edgecap train --model acort-nothing" in message


# -- which side of the backbone the graphs start on ------------------------------------------------------------------
class _Stop(Exception):
    """Raised by the stand-in ``export_onnx`` once it has seen what it was asked to export."""


@pytest.fixture
def seen_backbone(monkeypatch) -> dict:
    """Stops every export at ``export_onnx`` and records the backbone it was handed (None = features in)."""
    seen: dict = {}

    def export_onnx(model, out_dir=None, **kwargs):
        seen["backbone"] = kwargs.get("backbone")
        raise _Stop

    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", export_onnx)
    return seen


def test_pixels_in_is_the_default_for_a_run_on_backbone_features(tiny_data, tmp_path_factory, tmp_path, seen_backbone):
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    with pytest.raises(_Stop):
        export_bundle(run, tmp_path / "b", backbone_weights=weights, progress=False)
    assert seen_backbone["backbone"] is not None and seen_backbone["backbone"].name == "test_efficientnet"
    with pytest.raises(_Stop):
        export_bundle(run, tmp_path / "b", backbone_weights=weights, with_backbone=False, progress=False)
    assert seen_backbone["backbone"] is None  # --features-in


def test_region_runs_and_random_backbones_take_features(run, tiny_data, tmp_path_factory, tmp_path, seen_backbone):
    with pytest.raises(_Stop):
        export_bundle(run, tmp_path / "b", progress=False)
    assert seen_backbone["backbone"] is None
    pixels, _ = pixel_run(tiny_data, tmp_path_factory)
    random_run = Path(shutil.copytree(pixels, tmp_path / "random-run"))
    spec = json.loads((random_run / "config.json").read_text())["backbone"]
    edit_json(random_run / "config.json", backbone={**spec, "weights": {**spec["weights"], "source": "random"}})
    seen_backbone.clear()
    with pytest.raises(_Stop):
        export_bundle(random_run, tmp_path / "b", progress=False)
    assert seen_backbone["backbone"] is None
    with pytest.raises(BundleExportError, match="randomly initialised backbone"):
        export_bundle(random_run, tmp_path / "b", with_backbone=True, progress=False)


# -- where the bundle goes -------------------------------------------------------------------------------------------
def _graphs_of(bundle: Path):
    """A stand-in ``export_onnx`` returning ``bundle``'s own FP32 graphs (the export itself is not under test)."""
    return lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), backbone=k.get("backbone"))


def test_without_out_the_bundle_goes_home_and_replaces_the_old_one(run: Path, bundle: Path, tmp_path, monkeypatch):
    """``$EDGECAP_HOME/bundles/NAME``: built beside an existing bundle, verified, swapped in; leftovers of killed
    exports to the same place are cleaned when the next one starts, a live writer's are not."""
    monkeypatch.setenv("EDGECAP_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", _graphs_of(bundle))
    home = tmp_path / "home" / "bundles"
    first = export_bundle(run, progress=False, quality_images=0)
    assert first == home / "ort-test" and load_bundle(first).name == "ort-test"
    created = load_bundle(first).manifest["created"]
    (first / "weights.safetensors").touch()  # the old bundle is in place until the swap
    dead = home / ".ort-test.999999999-abcd1234.partial"
    legacy = home / ".ort-test.k3j_9x2a.partial"
    live = home / ".ort-test.1-zzzz0000.partial"  # pid 1 is alive on every machine
    other = home / ".ort-test-2.999999999-abcd1234.partial"  # another bundle's: not ours to judge
    for leftover in (dead, legacy, live, other):
        (leftover / "onnx").mkdir(parents=True)
    again = export_bundle(run, progress=False, quality_images=0)
    assert again == first and load_bundle(again).manifest["created"] >= created
    assert not dead.exists() and not legacy.exists() and live.exists() and other.exists()
    assert _leftovers(home) == sorted(p.name for p in (live, other))
    with pytest.raises(FileExistsError, match="overwrite"):
        export_bundle(run, first, progress=False)  # an explicit out still needs overwrite=True


def test_a_default_location_that_is_not_a_bundle_is_left_alone(run: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGECAP_HOME", str(tmp_path / "home"))
    notes = tmp_path / "home" / "bundles" / "ort-test"
    notes.mkdir(parents=True)
    (notes / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a bundle"):
        export_bundle(run, progress=False)
    assert (notes / "notes.txt").read_text() == "mine"


def test_a_swap_cut_in_half_is_recovered(tmp_path):
    """Killed between its two renames, a writer leaves the previous directory at ``.NAME.old``; the next writer to
    that place puts it back before replacing it, so no moment leaves only a half-written directory."""
    from edgecap.runtime._io import atomic_directory

    old = tmp_path / ".b.old"
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "b", overwrite=True):
        raise RuntimeError("killed again")
    assert (tmp_path / "b" / "manifest.json").is_file() and not old.exists()


# -- INT8 targets ----------------------------------------------------------------------------------------------------
def test_a_registered_preset_is_an_int8_target(run: Path, bundle: Path, tiny_data, tmp_path, monkeypatch):
    from edgecap.workshop.export.bundle import int8_targets
    from edgecap.workshop.export.calibration import presets

    custom = presets.get_preset("cpu-avx2").replace(name="edge-npu", description="an NPU's U8S8 kernels")
    monkeypatch.setitem(presets._PRESETS, "edge-npu", custom)
    assert "edge-npu" in int8_targets() and "cpu-auto" in int8_targets()
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", _graphs_of(bundle))
    out = export_bundle(
        run, tmp_path / "b", int8=True, calib=tiny_data[0], target="edge-npu", calib_size=4, quality_images=0,
        progress=False,
    )  # fmt: skip
    int8 = load_bundle(out).variant("int8")
    assert int8["target"] == "edge-npu" and int8["preset"] == "edge-npu"
    assert int8["deployment"] == {"provider": "cpu", "runs_on_any_cpu": True}  # cpu-avx2's, as registered


# -- INT8 step schemes -----------------------------------------------------------------------------------------------
def _region_inputs(tiny_data) -> dict:
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.training.batches import FeatureBank

    data, feats = tiny_data
    records = load_dataset(data).split("val")
    bank = FeatureBank(open_feature_source(feats), [r.image_id for r in records])
    return bank.batch(list(range(len(records)))).as_inputs()


def test_the_manifest_records_each_int8_roles_scheme_and_ops(bundle: Path):
    from edgecap.workshop.export.calibration import get_preset

    loaded = load_bundle(bundle)
    int8 = loaded.variant("int8")
    expected = get_preset(int8["preset"]).role("step")
    step = int8["schemes"]["step"]
    assert step["scheme"] == expected.scheme and step["bits"] == expected.bits
    op = {"static": "MatMul", "dynamic": "MatMulInteger", "weight-only": "MatMulNBits"}[expected.scheme]
    assert step["ops"][op] > 0
    graph = onnx.load(str(loaded.graph_path("int8", "step")))
    assert step["ops"][op] == sum(n.op_type == op for n in graph.graph.node) or expected.scheme == "static"
    encoder = int8["schemes"]["encoder"]
    assert encoder["scheme"] == "static" and encoder["qdq"]["DequantizeLinear"] > 0
    assert loaded.int8_schemes() == {role: int8["schemes"][role] for role in int8["files"]}


def test_a_bundle_without_scheme_records_reads_as_static_and_still_decodes(bundle: Path, tiny_data, tmp_path: Path):
    """Bundles exported before the per-role schemes hold static QDQ graphs and keep loading."""
    from edgecap import Captioner
    from edgecap.runtime.bundle.reader import MANIFEST_NAME
    from tests.runtime.bundle.helpers import copy_bundle

    old = copy_bundle(bundle, tmp_path / "old")
    manifest = json.loads((old / MANIFEST_NAME).read_text())
    del manifest["variants"]["int8"]["schemes"]
    (old / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
    loaded = load_bundle(old)
    assert loaded.int8_schemes() == {
        "encoder": {"scheme": "static", "bits": 8},
        "step": {"scheme": "static", "bits": 8},
    }
    with Captioner.load(old, runtime="onnxruntime", precision="int8") as cap:
        assert cap.runtime_info["int8_schemes"] == {"encoder": "static", "step": "static"}
        captions = cap.caption_inputs(_region_inputs(tiny_data))
        assert len(captions) == 4 and any(captions)  # a tiny run may end a caption at once


def test_a_weight_only_step_goes_through_the_task_check_and_decodes(
    run: Path, bundle: Path, tiny_data, tmp_path, monkeypatch
):
    from edgecap import Captioner

    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", _graphs_of(bundle))
    out = export_bundle(
        run, tmp_path / "b", int8=True, calib=tiny_data[0], calib_size=4, int8_step="weight-only", progress=False
    )
    loaded = load_bundle(out)
    step = loaded.variant("int8")["schemes"]["step"]
    assert step["scheme"] == "weight-only" and step["bits"] == 8 and step["ops"]["MatMulNBits"] > 0
    assert step["block_size"] == 128 and step["accuracy_level"] == 4
    quality = loaded.quality("int8")  # judged on the task like every INT8 variant
    assert quality["images"] == 4 and 0.0 <= quality["token_agreement"] <= 1.0
    with Captioner.load(out, runtime="onnxruntime", precision="int8") as cap:
        assert cap.runtime_info["int8_schemes"]["step"] == "weight-only"
        captions = cap.caption_inputs(_region_inputs(tiny_data))
        assert len(captions) == 4 and any(captions)  # a tiny run may end a caption at once


def test_a_dynamic_step_is_checked_image_by_image_as_it_is_served(
    run: Path, bundle: Path, tiny_data, tmp_path, monkeypatch
):
    """A dynamic step quantises a call's rows together; Captioner decodes such a variant image by image, so the
    export's task check must too, or the recorded quality is not that of the captions users get."""
    import edgecap.workshop.export.calibration as calibration

    seen: dict[str, bool] = {}
    compare = calibration.compare_decoders

    def recording(reference, candidate, *args, **kwargs):
        seen.setdefault("fp32" if "fp32" not in seen else "int8", candidate.rows_independent)
        return compare(reference, candidate, *args, **kwargs)

    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", _graphs_of(bundle))
    monkeypatch.setattr(calibration, "compare_decoders", recording)
    export_bundle(run, tmp_path / "b", int8=True, calib=tiny_data[0], calib_size=4, int8_step="dynamic", progress=False)
    assert seen == {"fp32": True, "int8": False}


def test_an_unknown_step_scheme_or_one_without_int8_is_refused(run: Path, tmp_path: Path):
    with pytest.raises(BundleExportError, match="unknown INT8 step scheme 'int4'"):
        export_bundle(run, tmp_path / "out", int8=True, calib=tmp_path, int8_step="int4")
    with pytest.raises(BundleExportError, match="int8_step= is only used for INT8"):
        export_bundle(run, tmp_path / "out", int8_step="dynamic")
    with pytest.raises(BundleExportError, match="--int8-step dynamic with --target tensorrt"):  # before any export
        export_bundle(run, tmp_path / "out", int8=True, calib=tmp_path, target="tensorrt", int8_step="dynamic")
    assert not (tmp_path / "out").exists()
