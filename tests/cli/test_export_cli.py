"""Smoke tests of ``edgecap export`` and of ``edgecap caption`` on a bundle, through click."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgecap.cli import main
from tests.runtime.bundle.helpers import pixel_bundle, pixel_run

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def exported(tiny_data, tmp_path_factory) -> tuple[Path, str]:
    return pixel_bundle(tiny_data, tmp_path_factory)  # runs `edgecap export` (pixels in by default) once


def test_export_writes_a_bundle_and_prints_its_table(exported):
    bundle, output = exported
    assert (bundle / "manifest.json").is_file() and (bundle / "onnx" / "fp32" / "init.onnx").is_file()
    assert "1/3 exporting ort-test" in output and "parity vs torch" in output
    assert "pixels in (test_efficientnet in the encoder graph)" in output  # the default, no flag given
    assert "pass: max |err|" in output and "100.0%" in output and f"bundle written to {bundle}" in output
    config = json.loads((bundle / "config.json").read_text())
    assert config["backbone_in_graph"] is True and config["backbone_weights"] == "backbone/tiny-backbone.safetensors"


def test_caption_runs_a_bundle_like_the_python_api(exported, tiny_data):
    from edgecap import Captioner

    bundle, _ = exported
    images = sorted((tiny_data[0] / "images").iterdir())[:3]
    result = CliRunner().invoke(main, ["caption", *map(str, images), "--model", str(bundle), "--json"])
    assert result.exit_code == 0, result.output
    captions = json.loads(result.stdout)
    assert list(captions.values()) == Captioner.load(bundle).batch(images)
    result = CliRunner().invoke(main, ["caption", str(images[0]), "--model", str(bundle), "--runtime", "torch"])
    assert result.exit_code == 0, result.output
    assert "runtime: ort-test on torch" in result.stderr and result.stdout.strip().endswith(captions[str(images[0])])


def test_caption_on_a_bundle_refuses_a_missing_precision(exported, tiny_data):
    bundle, _ = exported
    image = next((tiny_data[0] / "images").iterdir())
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(bundle), "--precision", "int8"])
    assert result.exit_code != 0 and "no 'int8' variant" in result.output


def test_caption_on_a_run_explains_that_onnxruntime_needs_a_bundle(tiny_data, tmp_path_factory):
    run, _ = pixel_run(tiny_data, tmp_path_factory)
    image = next((tiny_data[0] / "images").iterdir())
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(run), "--runtime", "onnxruntime"])
    assert result.exit_code != 0 and "edgecap export --model" in result.output


def test_export_of_an_unknown_name_says_where_it_looked(tmp_path: Path):
    home = tmp_path / "home"
    result = CliRunner().invoke(
        main, ["export", "--model", "acort-nothing", "--out", str(tmp_path / "b")], env={"EDGECAP_HOME": str(home)}
    )
    assert result.exit_code != 0
    assert str(home / "runs" / "acort-nothing" / "config.json") in result.output
    assert "edgecap train --model acort-nothing" in result.output and not (tmp_path / "b").exists()


def test_export_flags_are_checked(tmp_path: Path):
    result = CliRunner().invoke(main, ["export", "--model", "x", "--int8", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2 and "--int8 needs calibration images" in result.output
    args = ["export", "--model", "x", "--calib", str(tmp_path), "--out", str(tmp_path / "b")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--calib is only used with --int8" in result.output
    result = CliRunner().invoke(
        main, ["export", "--model", "x", "--int8-step", "dynamic", "--out", str(tmp_path / "b")]
    )
    assert result.exit_code == 2 and "--int8-step is only used with --int8" in result.output
    args = ["export", "--model", "x", "--int8", "--calib", str(tmp_path), "--int8-step", "int4"]
    result = CliRunner().invoke(main, args)
    assert (
        result.exit_code == 2
        and "'int4' is not one of 'static', 'dynamic', 'weight-only', 'weight-only-4'" in result.output
    )
    # a Triton repository is `edgecap triton-repo`'s to write, the one place for it; export makes the bundle only
    result = CliRunner().invoke(main, ["export", "--model", "x", "--triton-repo", str(tmp_path / "repo")])
    assert result.exit_code == 2 and "No such option" in result.output and not (tmp_path / "repo").exists()


def test_export_refuses_an_empty_calibration_set(tiny_data, tmp_path_factory, tmp_path: Path):
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    empty = tmp_path / "calib"
    empty.mkdir()
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--int8", "--calib", str(empty)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code != 0 and "calibration set is empty" in result.output and not (tmp_path / "b").exists()


def test_export_help_imports_no_torch_and_lists_registered_targets():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from edgecap.cli import main\n"
        "from edgecap.workshop.export.calibration.presets import get_preset, register_preset\n"
        "register_preset(get_preset('cpu-avx2').replace(name='edge-npu', description='an NPU'))\n"
        "result = CliRunner().invoke(main, ['export', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert 'edge-npu' in result.output and '--with-backbone / --features-in' in result.output, result.output\n"
        "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'timm') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_unregistered_target_is_refused_naming_the_registered_ones(tmp_path: Path):
    args = ["export", "--model", "x", "--int8", "--calib", str(tmp_path), "--target", "gpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "'gpu' is not one of" in result.output and "'tensorrt'" in result.output


def test_the_first_export_command_works_verbatim(tiny_data, tmp_path_factory, tmp_path: Path, monkeypatch):
    """``edgecap export --model NAME --fp16`` (no --out, no flags about the backbone) on a run trained on the packaged
    EfficientNet-Lite0's features: a pixels-in FP32+FP16 bundle at $EDGECAP_HOME/bundles/NAME; run again, it replaces
    that bundle and says so. Then the decode-level promise: beam search on the FP32 graphs from pixels gives the
    torch model's hypotheses (tokens and scores)."""
    import edgecap.workshop.export
    from edgecap.runtime.backends.onnxruntime.decoders import create_onnxruntime_decoder
    from edgecap.runtime.bundle import load_bundle
    from edgecap.runtime.captioning import decode_cfg_for
    from edgecap.runtime.decoding import decode
    from edgecap.workshop.export.bundle import load_source
    from edgecap.workshop.export.bundling.quality import PixelReference
    from edgecap.workshop.torch_runtime.captioning import decoder_for
    from tests.runtime.bundle.helpers import export_result_from

    home = tmp_path / "home"
    run, _ = pixel_run(tiny_data, tmp_path_factory, "ort-test", packaged=True)
    (home / "runs").mkdir(parents=True)
    shutil.copytree(run, home / "runs" / "ort-test")
    env = {"EDGECAP_HOME": str(home)}
    result = CliRunner().invoke(main, ["export", "--model", "ort-test", "--fp16"], env=env)
    assert result.exit_code == 0, result.output
    bundle = home / "bundles" / "ort-test"
    assert "pixels in (tf_efficientnet_lite0 in the encoder graph)" in result.output
    assert f"bundle written to {bundle}" in result.output and "replaced" not in result.output
    opened = load_bundle(bundle)
    assert opened.backbone_in_graph and opened.config["backbone_weights"] is None  # packaged: nothing to carry
    assert opened.decode_inputs == ("pixel_values",) and opened.precisions == ("fp32", "fp16")
    for precision in ("fp32", "fp16"):
        parity = opened.variant(precision)["parity"]
        assert all(report["passed"] for report in parity.values()), parity
    assert opened.quality("fp32")["agreement"] == 1.0 and opened.quality("fp16")["images"] == 4

    stand_in = lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), k["backbone"], name="ort-test")  # noqa: E731
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)
    again = CliRunner().invoke(main, ["export", "--model", "ort-test", "--quiet"], env=env)
    assert again.exit_code == 0, again.output
    assert f"replaced the existing bundle at {bundle}" in again.output
    assert load_bundle(bundle).precisions == ("fp32",) and _leftovers(bundle.parent) == []

    monkeypatch.setenv("EDGECAP_HOME", str(home))
    source = load_source("ort-test")
    cfg = decode_cfg_for(source.vocab, beam_size=3, max_words=source.max_words)
    images = sorted((tiny_data[0] / "images").iterdir())[:4]
    backbone = source.backbone()
    pixels = {"pixel_values": backbone.preprocess(images)}
    reference = decode(PixelReference(backbone, decoder_for(source.model, "cpu")), pixels, cfg)
    graphs = {role: load_bundle(bundle).graph_path("fp32", role) for role in ("encoder", "step")}
    with create_onnxruntime_decoder(
        graphs, opened.state_names, updated_state_names=opened.updated_state_names
    ) as onnxruntime:
        candidate = decode(onnxruntime, pixels, cfg)
    for ref, got in zip(reference, candidate, strict=True):
        assert [h.tokens for h in got] == [h.tokens for h in ref]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in ref], atol=1e-4)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_export_refuses_a_folder_of_non_images_before_the_fp32_export(
    tiny_data, tmp_path_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import edgecap.workshop.export

    def no_export(*args, **kwargs):
        raise AssertionError("the FP32 export started before the calibration set was checked")

    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", no_export)
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    calib = tmp_path / "calib"
    calib.mkdir()
    for name in ("a.jpg", "b.png"):
        (calib / name).write_text("not an image")
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--int8", "--calib", str(calib)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code != 0 and "calibration set is empty" in result.output, result.output
    assert result.output.count(str(calib / "a.jpg")) == 1  # named once, not "PATH: PATH: ..."
    assert not (tmp_path / "b").exists()


def test_a_preset_registered_in_a_test_is_an_export_target(
    exported, tiny_data, tmp_path_factory, tmp_path, monkeypatch
):
    """``register_preset()`` is the only edit needed: ``--target toy`` is accepted, listed in ``--help`` and used."""
    import edgecap.workshop.export
    from edgecap.runtime.bundle import load_bundle
    from edgecap.workshop.export.calibration import presets
    from tests.runtime.bundle.helpers import export_result_from

    bundle, _ = exported
    monkeypatch.setattr(presets, "_PRESETS", dict(presets._PRESETS))  # the registration ends with the test
    presets.register_preset(
        presets.QuantPreset(name="toy", description="a toy target: U8S8, 7-bit weights", activation_type="uint8")
    )
    stand_in = lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), backbone=k.get("backbone"))  # noqa: E731
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)
    assert "toy" in CliRunner().invoke(main, ["export", "--help"]).output
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--int8", "--calib", str(tiny_data[0])]
    args += ["--calib-size", "4", "--quality-images", "0", "--quiet"]
    result = CliRunner().invoke(main, [*args, "--target", "toy", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    int8 = load_bundle(tmp_path / "b").variant("int8")
    assert int8["target"] == "toy" and int8["preset"] == "toy" and int8["deployment"]["provider"] == "cpu"
    unknown = CliRunner().invoke(main, [*args, "--target", "nope", "--out", str(tmp_path / "c")])
    assert unknown.exit_code != 0 and "toy" in unknown.output  # the refusal lists the registered target


def test_accuracy_target_flags_are_checked(tmp_path: Path):
    base = ["export", "--model", "x", "--out", str(tmp_path / "b")]
    result = CliRunner().invoke(main, [*base, "--min-agreement", "0.85"])
    assert result.exit_code == 2 and "--min-agreement selects INT8 layers" in result.output
    int8 = [*base, "--int8", "--calib", str(tmp_path)]
    result = CliRunner().invoke(main, [*int8, "--min-agreement", "85"])
    assert result.exit_code == 2 and "0<=x<=1" in result.output.replace(" ", "")
    result = CliRunner().invoke(main, [*int8, "--max-cider-drop", "-0.3"])
    assert result.exit_code == 2 and "--max-cider-drop" in result.output
    result = CliRunner().invoke(main, [*int8, "--max-cider-drop", "0.3", "--quality-images", "0"])
    assert result.exit_code == 2 and "--quality-images > 0" in result.output


def _stand_in_export(exported, monkeypatch):
    import edgecap.workshop.export
    from tests.runtime.bundle.helpers import export_result_from

    bundle, _ = exported
    stand_in = lambda model, *a, **k: export_result_from(bundle, model, ("fp32",), backbone=k.get("backbone"))  # noqa: E731
    monkeypatch.setattr(edgecap.workshop.export, "export_onnx", stand_in)


def test_accuracy_aware_int8_records_its_selection_and_compression(
    exported, tiny_data, tmp_path_factory, tmp_path, monkeypatch
):
    from edgecap.runtime.bundle import load_bundle
    from edgecap.runtime.bundle.manifest import compression_recipe, int8_selection

    _stand_in_export(exported, monkeypatch)
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    copy = Path(shutil.copytree(run, tmp_path / "run"))  # a "QAT" run whose parent is gone
    config = json.loads((copy / "config.json").read_text())
    config["compression"] = [{"kind": "qat", "epochs": 1, "parent": str(tmp_path / "gone")}]
    (copy / "config.json").write_text(json.dumps(config))
    args = ["export", "--model", str(copy), "--backbone-weights", str(weights), "--int8", "--calib", str(tiny_data[0])]
    args += ["--calib-size", "4", "--quality-images", "4", "--min-agreement", "0.5", "--max-cider-drop", "5"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    manifest = load_bundle(tmp_path / "b").manifest
    selection = int8_selection(manifest)
    assert selection is not None and selection["target"] == {"max_cider_drop": 5.0, "min_agreement": 0.5}
    assert selection["layers_considered"] > 0 and selection["quality"]["agreement"] >= 0.5
    assert set(selection["latency"]["selected"]) == {"encoder_ms", "step_ms", "caption_ms"}
    assert compression_recipe(manifest) == "qat" and manifest["compression"]["steps"][0]["epochs"] == 1
    assert manifest["variants"]["int8"]["quality"]["reference"] == "torch FP32 (this run; parent missing)"


def test_an_unreachable_accuracy_target_writes_nothing(exported, tiny_data, tmp_path_factory, tmp_path, monkeypatch):
    from edgecap.workshop.export.calibration.sensitivity import Int8Target

    _stand_in_export(exported, monkeypatch)
    monkeypatch.setattr(Int8Target, "shortfalls", lambda self, quality: ["never enough"])
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--int8", "--calib", str(tiny_data[0])]
    args += ["--calib-size", "4", "--quality-images", "4", "--min-agreement", "0.99", "--quiet"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code != 0 and "cannot meet the target" in result.output and "Best reached" in result.output
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path) == []


def test_bundles_without_the_new_fields_read_as_uncompressed(exported):
    from edgecap.runtime.bundle import load_bundle
    from edgecap.runtime.bundle.manifest import compression_recipe, int8_selection

    manifest = load_bundle(exported[0]).manifest
    assert compression_recipe(manifest) is None and int8_selection(manifest) is None
    assert compression_recipe({"compression": {"recipe": 3}}) is None
