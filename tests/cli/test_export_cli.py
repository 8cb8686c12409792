"""Smoke tests of ``edgecap export`` and of ``edgecap caption`` on a bundle, through click."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgecap.cli import main
from tests.bundle.helpers import pixel_bundle, pixel_run

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def exported(tiny_data, tmp_path_factory) -> tuple[Path, str]:
    return pixel_bundle(tiny_data, tmp_path_factory)  # runs `edgecap export ... --with-backbone` once


def test_export_writes_a_bundle_and_prints_its_table(exported):
    bundle, output = exported
    assert (bundle / "manifest.json").is_file() and (bundle / "onnx" / "fp32" / "init.onnx").is_file()
    assert "1/3 exporting ort-test" in output and "parity vs torch" in output
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


def test_caption_on_a_run_explains_that_ort_needs_a_bundle(tiny_data, tmp_path_factory):
    run, _ = pixel_run(tiny_data, tmp_path_factory)
    image = next((tiny_data[0] / "images").iterdir())
    result = CliRunner().invoke(main, ["caption", str(image), "--model", str(run), "--runtime", "ort"])
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


def test_export_refuses_an_empty_calibration_set(tiny_data, tmp_path_factory, tmp_path: Path):
    run, weights = pixel_run(tiny_data, tmp_path_factory)
    empty = tmp_path / "calib"
    empty.mkdir()
    args = ["export", "--model", str(run), "--backbone-weights", str(weights), "--int8", "--calib", str(empty)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code != 0 and "calibration set is empty" in result.output and not (tmp_path / "b").exists()
